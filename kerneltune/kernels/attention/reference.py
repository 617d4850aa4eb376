"""Attention through XLA: the forward with its log-sum-exp, the backward from those
residuals, and a float32 reference for tests.

The log-sum-exp is kept in base 2 (`log2 Σ 2^(s·log2 e)`), the convention of JAX's
Pallas kernel, so residuals from either forward fit either backward.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels.attention.backward import BackwardKernelGradient, every_head

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


def attention_forward_xla(
    q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, sm_scale: float
) -> tuple[jax.Array, jax.Array]:
    """`softmax(q kᵀ · sm_scale) v` and its base-2 log-sum-exp `[batch, heads, q_len]`."""
    s = _scores(q, k, causal=causal, sm_scale=sm_scale)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    out = jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.astype(q.dtype), lse * jnp.float32(LOG2E)


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
    """`attention_forward_xla`'s output, a chunk of queries at a time when the whole
    score matrix would exceed `score_bytes`. Each chunk is rematerialised under a
    gradient, so the backward too holds one chunk's scores at a time."""
    b, q_len, h, _ = q.shape
    kv_len = k.shape[1]
    rows = max(1, score_bytes // (b * h * kv_len * 4))
    if rows >= q_len:
        return attention_forward_xla(q, k, v, causal=causal, sm_scale=sm_scale)[0]
    chunk = max(c for c in range(1, rows + 1) if q_len % c == 0)
    n = q_len // chunk

    def one_chunk(start: jax.Array, q_chunk: jax.Array) -> jax.Array:
        s = _scores(q_chunk, k, causal=causal, sm_scale=sm_scale, q_start=start)
        p = jax.nn.softmax(s, axis=-1)
        out = jnp.einsum(
            "bhqk,bkhd->bqhd", p.astype(v.dtype), v, preferred_element_type=jnp.float32
        )
        return out.astype(q.dtype)

    chunks = jnp.moveaxis(q.reshape(b, n, chunk, *q.shape[2:]), 1, 0)
    starts = jnp.arange(n) * chunk
    out = jax.lax.map(lambda xs: jax.checkpoint(one_chunk)(*xs), (starts, chunks))
    return jnp.moveaxis(out, 0, 1).reshape(q.shape)


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
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """dq, dk, dv from the forward's output and base-2 log-sum-exp (the flash-attention
    backward: the probabilities are recomputed, never stored)."""
    f32 = jnp.float32
    s = _scores(q, k, causal=causal, sm_scale=sm_scale)
    p = jnp.exp(s - (lse / f32(LOG2E))[..., None])
    do = dout.astype(f32)
    dv = jnp.einsum("bhqk,bqhd->bkhd", p, do)
    dp = jnp.einsum("bqhd,bkhd->bhqk", do, v.astype(f32))
    delta = jnp.einsum("bqhd,bqhd->bhq", do, out.astype(f32))
    ds = p * (dp - delta[..., None]) * f32(sm_scale)
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds, k.astype(f32))
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q.astype(f32))
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
    """The scores materialised in XLA, saving the log-sum-exp for the backward kernel:
    what a CPU, a TPU or `KERNELTUNE_PLATFORM=xla` runs for a Pallas config (no config
    names it)."""

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
