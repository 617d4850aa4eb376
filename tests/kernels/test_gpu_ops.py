"""On a GPU: the bundled ops' Pallas (Triton) paths with their second derivatives, a
Pallas kernel under shard_map, and `kt.autotune(f)` on a small model step. Skipped
without a GPU (the conftest marks `gpu` tests)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import kerneltune as kt
from kerneltune.kernels import (
    FwdParams,
    MatmulConfig,
    NormConfig,
    SoftmaxConfig,
    attention,
    layer_norm,
    matmul,
    rms_norm,
    softmax,
)
from tests.helpers import close, executor, rand

pytestmark = pytest.mark.gpu

F32 = jnp.float32
#: The tolerance of `close` where a test names none.
TOL = 2e-2


def second(fn, x):
    w = rand(x.shape, seed=99)
    return jax.grad(lambda x: (jax.grad(lambda x: (fn(x) ** 2).sum())(x) * w).sum())(x)


def with_highest(fn):
    def call(*a):
        with jax.default_matmul_precision("highest"):
            return fn(*a)

    return call


CASES = {
    "attention": (
        lambda q: attention(
            q, q, q, is_causal=True,
            cfg=FwdParams(q_blocksize=64, kv_blocksize=64, num_warps=4, num_stages=2),
        ),
        lambda q: jax.nn.dot_product_attention(q, q, q, is_causal=True),
        (2, 128, 4, 64),
    ),
    "layer_norm": (
        lambda x: layer_norm(x, cfg=NormConfig(block_size=256, num_warps=4)),
        lambda x: (x - x.mean(-1, keepdims=True))
        * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-6),
        (64, 256),
    ),
    "rms_norm": (
        lambda x: rms_norm(x, cfg=NormConfig(block_size=256, num_warps=4)),
        lambda x: x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6),
        (64, 256),
    ),
    "softmax": (
        lambda x: softmax(x, cfg=SoftmaxConfig(num_warps=4)),
        jax.nn.softmax,
        (64, 256),
    ),
    "matmul": (
        lambda x: matmul(x, x.T, cfg=MatmulConfig(block_m=64, block_n=64, block_k=32)),
        lambda x: x @ x.T,
        (128, 128),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_pallas_values_gradients_and_second_derivatives(name):
    ours, ref, shape = CASES[name]
    x = rand(shape, seed=0)
    ref = with_highest(ref)
    close(jax.jit(ours)(x), ref(x), tol=TOL)
    close(
        jax.jit(jax.grad(lambda x: (ours(x) ** 2).sum()))(x),
        jax.grad(lambda x: (ref(x) ** 2).sum())(x),
        tol=TOL,
    )
    close(jax.jit(lambda x: second(ours, x))(x), second(ref, x), tol=5e-2)


def test_a_pallas_kernel_under_shard_map():
    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    x = rand((64, 256), seed=0)
    y = layer_norm(x, cfg=NormConfig(block_size=256, num_warps=4))
    from kerneltune.kernels.normalization import LayerNorm

    ex = kt.default_executor()
    got = ex(LayerNorm(), x, jnp.ones(256), jnp.zeros(256), eps=1e-6,
             cfg=NormConfig(block_size=256, num_warps=4),
             method="shard_map", mesh=mesh, in_specs=(P("x"), P(), P()), out_specs=P("x"))  # fmt: skip
    close(got, y, tol=TOL)


def test_autotune_a_whole_step_on_the_gpu(tmp_path):
    q = rand((2, 256, 4, 64), seed=1).astype(jnp.bfloat16)

    def loss(q):
        h = rms_norm(q)
        return attention(h, h, h, is_causal=True).astype(F32).sum()

    step = jax.jit(jax.value_and_grad(loss))
    result = kt.autotune(step, q)
    ops = sorted({e.op_id_v.partition("@")[0] for e in result})
    # Every kernel call of the step is listed: tuned, or with why there was nothing to
    # tune (without tokamax, cuDNN is the one candidate of attention under a gradient).
    assert "attention" in ops and "rms_norm" in ops, ops
    for e in result:
        assert not e.untuned or e.strategy.startswith("untuned: "), e
    value, grad = step(q)
    assert np.isfinite(float(value)) and bool(jnp.isfinite(grad.astype(F32)).all())


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_the_tokamax_backend_matches_jax_values_and_gradients(causal, kv_heads):
    from kerneltune.kernels.attention import tokamax_backend

    reason = tokamax_backend.unsupported(np.dtype(jnp.bfloat16), 64)
    if reason is not None:
        pytest.skip(reason)
    q = rand((2, 256, 4, 64), seed=1).astype(jnp.bfloat16)
    k = rand((2, 256, kv_heads, 64), seed=2).astype(jnp.bfloat16)
    v = rand((2, 256, kv_heads, 64), seed=3).astype(jnp.bfloat16)
    cfg = FwdParams(backend="tokamax")

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v).astype(F32) * rand(q.shape, seed=4)).sum()

    ours = lambda q, k, v: attention(q, k, v, is_causal=causal, cfg=cfg)  # noqa: E731
    theirs = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
        q.astype(F32), k.astype(F32), v.astype(F32), is_causal=causal
    )
    close(jax.jit(ours)(q, k, v), theirs(q, k, v), tol=TOL)
    got = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(loss(theirs), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        close(g, w, tol=3e-2)


def test_a_long_causal_forward_runs_tokamax_and_hidden_training_runs_cudnn():
    # A causal forward alone of 8k+ tokens with head dim 128 runs tokamax (its forward
    # took 0.91-0.97x cuDNN's); a training call hidden from kerneltune by jax.checkpoint
    # is keyed as that forward and must get cuDNN's gradients, not tokamax's backward.
    from kerneltune.kernels import Attention
    from kerneltune.kernels.attention import tokamax_backend

    reason = tokamax_backend.unsupported(np.dtype(jnp.bfloat16), 128)
    if reason is not None:
        pytest.skip(reason)
    q = rand((1, 8192, 4, 128), seed=1).astype(jnp.bfloat16)
    k = rand((1, 8192, 2, 128), seed=2).astype(jnp.bfloat16)
    v = rand((1, 8192, 2, 128), seed=3).astype(jnp.bfloat16)
    ex = executor()
    chosen = kt.explain(Attention(executor=ex), q, k, v, causal=True, executor=ex)
    assert chosen.cfg == FwdParams(backend="tokamax"), str(chosen)

    ours = lambda q, k, v: attention(q, k, v, is_causal=True, executor=ex)  # noqa: E731
    cudnn = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True, implementation="cudnn"
    )
    close(jax.jit(ours)(q, k, v), cudnn(q, k, v), tol=TOL)

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v).astype(F32) * rand(q.shape, seed=4)).sum()

    got = jax.jit(jax.grad(loss(jax.checkpoint(ours)), argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(loss(cudnn), argnums=(0, 1, 2)))(q, k, v)
    for g, w in zip(got, want, strict=True):
        close(g, w, tol=3e-2)
