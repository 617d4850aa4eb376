"""Every attention variant through XLA a block of queries at a time: the logits are
never whole, so memory grows with the sequence, not with its square.

One block of `block_q` queries meets every key (or, under a local window, the band of
keys the window lets it see), through `features.attend`, the reference's own math. The
blocks run one after another (`lax.map`), each under `jax.checkpoint`: the backward
recomputes a block's logits rather than keeping them, so a training step holds one
block's logits too. This is the path for CPUs, for calls no library kernel takes (a
soft cap without tokamax), and the reference that tuning checks long calls against.
"""

from __future__ import annotations

import functools
from typing import Any, overload

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._args import explicitly_sharded, explicitly_sharded_dims
from kerneltune.kernels._common import next_power_of_2
from kerneltune.kernels.attention.backward import every_head
from kerneltune.kernels.attention.features import attend, zero_padded_rows
from kerneltune.kernels.attention.masking import Masks, keep


def explicit_sharding_backend(q, k, v, bias, masks: Masks) -> str | None:
    """The variants' plain-JAX backend for a call whose arrays are sharded over explicit
    mesh axes (sharding in types), None for any other call. The Pallas kernels refuse
    such types, and plain attention's blocked backward sums over a sharded token axis
    without an `out_sharding`; JAX differentiates both paths named here, which carry
    the shardings as `jax.nn`'s attention does: these blocks of queries ("chunked"), or
    the whole logits ("xla") where the queries' axis is sharded (a map over blocks of
    it takes no sharded axis)."""
    if not explicitly_sharded(q, k, v, bias, *masks):
        return None
    by_query = (
        1 in explicitly_sharded_dims(q)
        or 1 in explicitly_sharded_dims(masks.q_segments)
        or any(2 in explicitly_sharded_dims(x) for x in (bias, masks.mask))
    )
    return "xla" if by_query else "chunked"


@overload
def _pad_rows(x: jax.Array, axis: int, to: int) -> jax.Array: ...
@overload
def _pad_rows(x: jax.Array | None, axis: int, to: int) -> jax.Array | None: ...
def _pad_rows(x: jax.Array | None, axis: int, to: int) -> jax.Array | None:
    """`x` padded with zeros along `axis` to `to` (unchanged where that axis is 1: it
    broadcasts)."""
    if x is None or x.shape[axis] in (1, to):
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, to - x.shape[axis])
    return jnp.pad(x, widths)


@overload
def _cut(x: jax.Array, axis: int, start: Any, size: int) -> jax.Array: ...
@overload
def _cut(x: jax.Array | None, axis: int, start: Any, size: int) -> jax.Array | None: ...
def _cut(x: jax.Array | None, axis: int, start: Any, size: int) -> jax.Array | None:
    """`size` entries of `x` from `start` along `axis` (all of a broadcast axis)."""
    if x is None or x.shape[axis] == 1:
        return x
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis)


def key_band(s: int, block_q: int, window: tuple[int, int] | None, causal: bool) -> int:
    """How many keys one block of queries can see: all `s`, or under a local window
    the block's width plus the window's reach (to the left only when causal)."""
    if window is None:
        return s
    left, right = window
    return min(s, block_q + left + (0 if causal else right))


def attention_chunked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array | None,
    masks: Masks,
    *,
    scale: Any,
    causal: bool,
    window: tuple[int, int] | None,
    soft_cap: float | None,
    block_q: int | None = None,
) -> jax.Array:
    """What `features.attention_features_xla` computes, `block_q` queries at a time
    (None: `default_block_q`'s, the largest block whose logits fit its budget)."""
    b, t, n, h = q.shape
    s = k.shape[1]
    if block_q is None:
        block_q = default_block_q(q, k, window, causal)
    bq = min(block_q, t)
    blocks = -(-t // bq)
    tp = blocks * bq
    band = key_band(s, bq, window, causal)
    qp = _pad_rows(q, 1, tp)
    bias_p = _pad_rows(bias, 2, tp)
    mask_p = _pad_rows(masks.mask, 2, tp)
    q_seg_p = _pad_rows(masks.q_segments, 1, tp)

    # `every_head`, not `jnp.repeat`, which raises on heads sharded over an explicit mesh.
    every_key_alike = every_head(q, jnp.mean(v, axis=1, keepdims=True, dtype=jnp.float32))
    every_key_alike = every_key_alike[:, 0].astype(v.dtype)

    def one_block(i: jax.Array, q_blk: jax.Array) -> jax.Array:
        q_start = i * bq
        q_pos = q_start + jnp.arange(bq)
        if band == s:
            k_start: Any = 0
        else:  # the band starts where the window's reach from the block's first query does
            k_start = jnp.clip(q_start - window[0], 0, s - band)  # type: ignore[index]
        k_pos = k_start + jnp.arange(band)
        cut_keys = functools.partial(_cut, start=k_start, size=band)
        cut_rows = functools.partial(_cut, start=q_start, size=bq)
        blk_bias = cut_keys(cut_rows(bias_p, 2), axis=3)
        blk_masks = Masks(
            mask=cut_keys(cut_rows(mask_p, 2), axis=3),
            q_lengths=masks.q_lengths,
            kv_lengths=masks.kv_lengths,
            q_segments=cut_rows(q_seg_p, 1),
            kv_segments=cut_keys(masks.kv_segments, axis=1),
        )
        keep_mask = keep(q_pos, k_pos, blk_masks, causal=causal, window=window)
        out = attend(
            q_blk, _cut(k, 1, k_start, band), _cut(v, 1, k_start, band), blk_bias, keep_mask,
            scale=scale, soft_cap=soft_cap,
        )  # fmt: skip
        if band != s and keep_mask is not None:
            # A query that keeps no key of its band keeps none at all (the window hides
            # the rest): like `jax.nn` it weighs every key alike, not just the band's.
            kept_any = jnp.moveaxis(jnp.any(keep_mask, axis=-1), 1, 2)[..., None]
            out = jnp.where(kept_any, out, every_key_alike[:, None])
        return zero_padded_rows(out, q_pos, masks.q_lengths)

    q_blocks = jnp.moveaxis(qp.reshape(b, blocks, bq, n, h), 1, 0)
    body = jax.checkpoint(lambda xs: one_block(*xs))
    out = jax.lax.map(body, (jnp.arange(blocks), q_blocks))
    out = jnp.moveaxis(out, 0, 1).reshape(b, tp, n, v.shape[-1])
    return out[:, :t]


class ChunkedBackend(Backend):
    """`attention_chunked`: every variant, on every platform, in memory that grows with
    the sequence; JAX differentiates it (a block's logits recomputed)."""

    name = "chunked"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, q, k, v, bias, masks, *, cfg, causal, sm_scale, window, soft_cap):
        # A config of another backend that cannot run here (cuDNN's, tokamax's on a
        # CPU) comes to this fallback without a block: the default one.
        return attention_chunked(
            q, k, v, bias, masks, scale=sm_scale, causal=causal, window=window,
            soft_cap=soft_cap, block_q=cfg.block_q,
        )  # fmt: skip


#: The float32 logits one block of queries may hold by default.
BLOCK_LOGITS_BYTES = 1 << 28


def default_block_q(
    q: Any, k: Any, window: Any, causal: bool, budget: int = BLOCK_LOGITS_BYTES
) -> int:
    """The largest block of queries (16 to 1024) whose float32 logits fit `budget`."""
    b, t, n, _ = q.shape
    bq = min(1024, next_power_of_2(int(t)))
    while bq > 16 and 4 * b * n * bq * key_band(int(k.shape[1]), bq, window, causal) > budget:
        bq //= 2
    return bq
