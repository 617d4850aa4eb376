"""On a GPU: kerneltune's own Pallas Triton kernels (softmax, the norms, flash
attention), written when JAX 0.12.1 removed `jax.experimental.pallas.ops.gpu`'s, at
shapes that exercise what the interpreter cannot show: rows that are not a power of
two (masked lanes), rows walked in several chunks, grouped-query heads read in place,
causal block skipping and unequal lengths. Skipped without a GPU."""

import jax
import jax.numpy as jnp
import pytest

from kerneltune._src.params import BwdParams, FwdParams
from kerneltune.kernels.attention.backward import every_head
from kerneltune.kernels.attention.pallas_triton import flash_backward, flash_forward
from kerneltune.kernels.attention.reference import attention_forward_xla
from kerneltune.kernels.normalization.config import NormConfig
from kerneltune.kernels.normalization.pallas_triton import norm_backward, norm_forward
from kerneltune.kernels.normalization.reference import layer_norm_reference, rms_norm_reference
from kerneltune.kernels.softmax import config as softmax_config
from kerneltune.kernels.softmax.config import SoftmaxConfig
from kerneltune.kernels.softmax.pallas_triton import softmax_pallas
from tests.helpers import close, rand

pytestmark = pytest.mark.gpu

BF16 = jnp.bfloat16


@pytest.mark.parametrize("n", [100, 1000, 4096, 32768])
@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("warps", ["heuristic", 4])
def test_softmax_rows_of_any_width(n, dtype, warps):
    x = (rand((37, n), seed=n) * 4).astype(dtype)
    if warps == "heuristic":  # 1 warp up to 2048 elements, 4 at 4096, 16 at 32768
        cfg = softmax_config.heuristic(softmax_config.SoftmaxProblem(37, n, jnp.dtype(dtype)))
    else:
        cfg = SoftmaxConfig(num_warps=warps)
    got = jax.jit(lambda x: softmax_pallas(x, cfg=cfg, interpret=False))(x)
    assert got.dtype == dtype
    close(got.astype(jnp.float32), jax.nn.softmax(x.astype(jnp.float32)), tol=1e-2)


@pytest.mark.parametrize(("n", "block"), [(100, 128), (1000, 256), (4096, 1024), (5120, 4096)])
@pytest.mark.parametrize("centred", [True, False], ids=["layer_norm", "rms_norm"])
def test_norms_forward_and_backward_in_chunks(n, block, centred):
    x = (rand((33, n), seed=1) * 2 + 0.5).astype(BF16)
    w, b, dy = rand((n,), seed=2), rand((n,), seed=3), rand((33, n), seed=4).astype(BF16)
    cfg = NormConfig(block_size=block, num_warps=4)

    def ours(x, w, b, dy):
        out, mean, rstd = norm_forward(
            x, w, b if centred else None, cfg=cfg, eps=1e-5, interpret=False
        )
        return out, norm_backward(x, w, mean, rstd, dy, centred=centred, cfg=cfg, interpret=False)

    out, (dx, dw, db) = jax.jit(ours)(x, w, b, dy)

    def ref(x, w, b):
        if centred:
            return layer_norm_reference(x, w, b)
        return rms_norm_reference(x, w)

    expected, pullback = jax.vjp(ref, x.astype(jnp.float32), w, b)
    gx, gw, gb = pullback(dy.astype(jnp.float32))
    close(out.astype(jnp.float32), expected, tol=2e-2)
    close(dx.astype(jnp.float32), gx, tol=5e-2)
    close(dw, gw, tol=5e-2)
    if centred:
        close(db, gb, tol=5e-2)


ATTENTION = [
    # (batch, q_len, kv_len, heads, kv_heads, head_dim), causal, forward and backward blocks
    ((2, 512, 512, 8, 2, 128), True, (128, 64), (32, 64)),
    ((1, 1024, 1024, 4, 4, 64), True, (64, 128), (64, 128)),
    ((2, 256, 512, 4, 1, 64), False, (128, 128), (32, 64)),
]


@pytest.mark.parametrize(("shape", "causal", "fwd", "bwd"), ATTENTION)
def test_flash_attention_forward_and_backward(shape, causal, fwd, bwd):
    b, t, s, h, kh, d = shape
    q = rand((b, t, h, d), seed=5).astype(BF16)
    k, v = rand((b, s, kh, d), seed=6).astype(BF16), rand((b, s, kh, d), seed=7).astype(BF16)
    dout = rand((b, t, h, d), seed=8).astype(BF16)
    fcfg = FwdParams(q_blocksize=fwd[0], kv_blocksize=fwd[1], num_warps=4, num_stages=2)
    bcfg = BwdParams(q_blocksize=bwd[0], kv_blocksize=bwd[1], num_warps=4)
    scale = d**-0.5

    def ours(q, k, v, dout):
        out, lse = flash_forward(q, k, v, cfg=fcfg, causal=causal, sm_scale=scale, interpret=False)
        ke, ve = every_head(q, k), every_head(q, v)
        grads = flash_backward(
            q, ke, ve, out, lse, dout, cfg=bcfg, causal=causal, sm_scale=scale, interpret=False
        )
        return out, lse, grads

    out, lse, (dq, dk, dv) = jax.jit(ours)(q, k, v, dout)
    f32 = [a.astype(jnp.float32) for a in (q, every_head(q, k), every_head(q, v))]
    ref_out, ref_lse = attention_forward_xla(*f32, causal=causal, sm_scale=scale)
    _, pullback = jax.vjp(
        lambda *a: attention_forward_xla(*a, causal=causal, sm_scale=scale)[0], *f32
    )
    gq, gk, gv = pullback(dout.astype(jnp.float32))
    close(out.astype(jnp.float32), ref_out, tol=2e-2)
    close(lse, ref_lse, tol=1e-2)
    for got, want in ((dq, gq), (dk, gk), (dv, gv)):
        close(got.astype(jnp.float32), want, tol=5e-2)
