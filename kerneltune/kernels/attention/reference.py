"""Attention through XLA: the forward with its log-sum-exp, the backward from those
residuals, and a float32 reference for tests.

The log-sum-exp is kept in base 2 (`log2 Σ 2^(s·log2 e)`), the convention of JAX's
Pallas kernel, so residuals from either forward fit either backward.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels.attention.backward import BackwardKernelGradient, every_head
from kerneltune.kernels.attention.chunked import default_block_q

LOG2E = math.log2(math.e)
# A large finite negative number rather than -inf: exp() of it is 0 without NaNs.
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)


def _scores(
    q: jax.Array, k: jax.Array, *, causal: bool, sm_scale: float, precision=None, q_start=0
) -> jax.Array:
    """Scaled scores `[batch, heads, q_len, kv_len]` in float32, masked when causal
    (query i sees keys 0..i, as the Pallas flash kernel does; `q` holds the queries from
    position `q_start` on)."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32, precision=precision)
    s = s * jnp.float32(sm_scale)
    if causal:
        q_len, kv_len = q.shape[1], k.shape[1]
        visible = (q_start + jnp.arange(q_len))[:, None] >= jnp.arange(kv_len)[None, :]
        s = jnp.where(visible, s, jnp.float32(_MASKED))
    return s


def _forward_block(q, k, v, *, causal: bool, sm_scale: float, q_start: Any = 0):
    s = _scores(q, k, causal=causal, sm_scale=sm_scale, q_start=q_start)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    out = jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.astype(q.dtype), lse * jnp.float32(LOG2E)


def _in_blocks(x: jax.Array, axis: int, block: int) -> jax.Array:
    """`x` cut along `axis` into blocks of `block` rows, stacked on a new leading axis
    (the last block padded with zeros)."""
    blocks = -(-x.shape[axis] // block)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, blocks * block - x.shape[axis])
    x = jnp.pad(x, widths)
    x = x.reshape(*x.shape[:axis], blocks, block, *x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def _from_blocks(x: jax.Array, axis: int, rows: int) -> jax.Array:
    """`_in_blocks`'s inverse: the first `rows` rows along `axis`."""
    x = jnp.moveaxis(x, 0, axis)
    x = x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2 :])
    return jax.lax.slice_in_dim(x, 0, rows, axis=axis)


#: The most queries a block of `attention_forward_xla` and `attention_backward_xla`
#: takes by default. Smaller blocks keep a block's scores in the CPU's caches: causal,
#: d64, float32, B1, on a 2-core CPU (BENCHMARKS.md, 2026-12-07), forward + backward at
#: T 2048 2 heads took 67 ms in blocks of 256 against 126 ms in blocks of 1024 and 76 ms
#: whole; at T 4096 2 heads 245 ms against 449 ms and 273 ms.
XLA_BLOCK_Q = 256


def _block_q(q: jax.Array, k: jax.Array, causal: bool, block_q: int | None) -> int:
    if block_q is not None:
        return block_q
    return min(XLA_BLOCK_Q, default_block_q(q, k, None, causal))


def attention_forward_xla(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    sm_scale: float,
    block_q: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """`softmax(q kᵀ · sm_scale) v` and its base-2 log-sum-exp `[batch, heads, q_len]`,
    `block_q` queries at a time (None: `XLA_BLOCK_Q`, or fewer where the chunked
    variants' block, `chunked.default_block_q`, is smaller): a long call never holds its
    whole `[B, N, T, S]` scores, on a CPU or wherever this runs.
    Each block is rematerialised under a gradient JAX takes of it."""
    t = q.shape[1]
    bq = _block_q(q, k, causal, block_q)
    if t <= bq:
        return _forward_block(q, k, v, causal=causal, sm_scale=sm_scale)

    def one_block(xs):
        i, q_blk = xs
        return _forward_block(q_blk, k, v, causal=causal, sm_scale=sm_scale, q_start=i * bq)

    q_blocks = _in_blocks(q, 1, bq)
    starts = jnp.arange(q_blocks.shape[0])
    out, lse = jax.lax.map(jax.checkpoint(one_block), (starts, q_blocks))
    return _from_blocks(out, 1, t), _from_blocks(lse, 2, t)


#: The float32 scores one query chunk of `attention_forward_chunked` may hold: the
#: reference of a long sequence is computed a chunk of queries at a time, so validating
#: a 128k-token call does not need the [batch, heads, q, k] scores (1 TiB there).
CHUNK_SCORE_BYTES = 1 << 28


def attention_forward_chunked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    sm_scale: float,
    score_bytes: int = CHUNK_SCORE_BYTES,
) -> jax.Array:
    """`attention_forward_xla`'s output, in chunks of as many queries as `score_bytes`
    of float32 scores hold (whole when they all fit). Each chunk is rematerialised
    under a gradient, so the backward too holds one chunk's scores at a time."""
    b, q_len, h, _ = q.shape
    rows = max(1, score_bytes // (b * h * k.shape[1] * 4))
    return attention_forward_xla(
        q, k, v, causal=causal, sm_scale=sm_scale, block_q=min(rows, q_len)
    )[0]


def _backward_block(q, k, v, out, lse, dout, *, causal: bool, sm_scale: float, q_start: Any = 0):
    """A block of queries' dq and its share of dk and dv, in float32."""
    f32 = jnp.float32
    s = _scores(q, k, causal=causal, sm_scale=sm_scale, q_start=q_start)
    p = jnp.exp(s - (lse / f32(LOG2E))[..., None])
    do = dout.astype(f32)
    dv = jnp.einsum("bhqk,bqhd->bkhd", p, do)
    dp = jnp.einsum("bqhd,bkhd->bhqk", do, v.astype(f32))
    delta = jnp.einsum("bqhd,bqhd->bhq", do, out.astype(f32))
    ds = p * (dp - delta[..., None]) * f32(sm_scale)
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds, k.astype(f32))
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q.astype(f32))
    return dq, dk, dv


def attention_backward_xla(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    out: jax.Array,
    lse: jax.Array,
    dout: jax.Array,
    *,
    causal: bool,
    sm_scale: float,
    block_q: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """dq, dk, dv from the forward's output and base-2 log-sum-exp (the flash-attention
    backward: the probabilities are recomputed, never stored), `block_q` queries at a
    time as in `attention_forward_xla`, dk and dv summed over the blocks."""
    t = q.shape[1]
    kw: dict[str, Any] = dict(causal=causal, sm_scale=sm_scale)
    bq = _block_q(q, k, causal, block_q)
    if t <= bq:
        dq, dk, dv = _backward_block(q, k, v, out, lse, dout, **kw)
    else:
        # Padded rows (zero queries, outputs and output gradients) add nothing to dk, dv.
        rows = [_in_blocks(x, 1, bq) for x in (q, out, dout)] + [_in_blocks(lse, 2, bq)]

        def step(carry, xs):
            i, q_blk, out_blk, dout_blk, lse_blk = xs
            dq_blk, dk_blk, dv_blk = _backward_block(
                q_blk, k, v, out_blk, lse_blk, dout_blk, q_start=i * bq, **kw
            )
            return (carry[0] + dk_blk, carry[1] + dv_blk), dq_blk

        zeros = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
        starts = jnp.arange(rows[0].shape[0])
        (dk, dv), dq_blocks = jax.lax.scan(step, zeros, (starts, *rows))
        dq = _from_blocks(dq_blocks, 1, t)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def attention_reference(
    q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False, sm_scale: float | None = None
) -> jax.Array:
    """Plain `softmax(q kᵀ · sm_scale) v` in float32 at the highest precision
    (differentiable by JAX): what tests compare with."""
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    f32 = jnp.float32
    q, k, v = q.astype(f32), k.astype(f32), v.astype(f32)
    hi = jax.lax.Precision.HIGHEST
    p = jax.nn.softmax(_scores(q, k, causal=causal, sm_scale=sm_scale, precision=hi), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v, precision=hi)


class ReferenceBackend(BackwardKernelGradient):
    """Attention in XLA a block of queries at a time (`attention_forward_xla`), saving the
    log-sum-exp for the backward kernel: what a CPU, a TPU or `KERNELTUNE_PLATFORM=xla`
    runs for a Pallas config (no config names it)."""

    name = "reference"
    plain_jax = True

    def run(self, kernel, q, k, v, *, cfg, causal: bool, sm_scale: float):
        return self.fwd_with_residuals(kernel, q, k, v, cfg=cfg, causal=causal, sm_scale=sm_scale)[
            0
        ]

    def fwd_with_residuals(self, kernel, q, k, v, *, cfg, causal: bool, sm_scale: float):
        k, v = every_head(q, k), every_head(q, v)
        return attention_forward_xla(q, k, v, causal=causal, sm_scale=sm_scale)


class XlaBackwardBackend(Backend):
    """The backward pass in XLA, from the saved log-sum-exp."""

    name = "xla"
    plain_jax = True

    def run(self, kernel, q, k, v, out, lse, dout, *, cfg, causal: bool, sm_scale: float):
        return attention_backward_xla(q, k, v, out, lse, dout, causal=causal, sm_scale=sm_scale)
