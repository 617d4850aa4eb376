"""kerneltune's Pallas softmax, norms and flash attention are its own: JAX 0.12.1
removed the `jax.experimental.pallas.ops.gpu` Triton kernels they wrapped (89 tests
failed there). With those modules unimportable on any JAX, each op runs its Pallas path
in the interpreter, forward and backward, and matches plain JAX; before, each raised
ModuleNotFoundError."""

import sys

import jax
import jax.numpy as jnp
import pytest

from kerneltune._src.core import options
from kerneltune.kernels import attention, layer_norm, rms_norm, softmax
from tests.helpers import close, heuristics_executor, rand

#: JAX's Pallas GPU modules that JAX 0.12.1 removed.
REMOVED = ("softmax", "layer_norm", "rms_norm", "attention")
EX = heuristics_executor()


@pytest.fixture(autouse=True)
def without_jaxs_triton_kernels(monkeypatch):
    # A None entry in sys.modules makes `import` raise ModuleNotFoundError, as on 0.12.1.
    for name in REMOVED:
        monkeypatch.setitem(sys.modules, f"jax.experimental.pallas.ops.gpu.{name}", None)


def value_and_grad(fn, x, w):
    return jax.jit(lambda x: (fn(x), jax.grad(lambda x: (fn(x) * w).sum())(x)))(x)


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "rms_norm"])
def test_the_rowwise_ops_run_their_pallas_path_without_jaxs_kernels(op):
    x, w = rand((6, 100), seed=1) * 3, rand((6, 100), seed=2)
    scale, bias = 1 + rand((100,), seed=3), rand((100,), seed=4)

    def ref_layer_norm(x):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-6) * scale + bias

    ours, ref = {
        "softmax": (lambda x: softmax(x, executor=EX), jax.nn.softmax),
        "layer_norm": (lambda x: layer_norm(x, scale, bias, executor=EX), ref_layer_norm),
        "rms_norm": (
            lambda x: rms_norm(x, scale, executor=EX),
            lambda x: x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale,
        ),
    }[op]
    with options.scoped(platform="triton"):
        got, grad = value_and_grad(ours, x, w)
    want, want_grad = value_and_grad(ref, x, w)
    close(got, want, tol=2e-5)
    close(grad, want_grad, tol=2e-5)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_attention_runs_its_pallas_flash_kernel_without_jaxs(causal):
    q = rand((1, 32, 4, 16), seed=5)
    k, v = rand((1, 32, 2, 16), seed=6), rand((1, 32, 2, 16), seed=7)
    w = rand(q.shape, seed=8)

    def grads(fn):
        def loss(q, k, v):
            return (fn(q, k, v) * w).sum()

        return jax.jit(lambda *a: (fn(*a), jax.grad(loss, (0, 1, 2))(*a)))(q, k, v)

    with options.scoped(platform="triton"):
        got, got_grads = grads(lambda *a: attention(*a, is_causal=causal, executor=EX))
    want, want_grads = grads(lambda *a: jax.nn.dot_product_attention(*a, is_causal=causal))
    close(got, want, tol=2e-5)
    for g, r in zip(got_grads, want_grads, strict=True):
        close(g, r, tol=2e-5)
    assert got.dtype == jnp.float32
