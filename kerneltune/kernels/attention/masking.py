"""Which logits of an attention call take part, for any block of queries and keys.

Every variant of attention is plain attention with some logits left out: a causal
mask, a local window, padding (sequence lengths), packed documents (segment ids) or a
boolean mask of the user's. `keep` says which, for the queries at `q_pos` and the keys
at `k_pos`, so the materialising reference and the chunked path (which sees one block
of queries, and under a window one band of keys, at a time) share one definition.

`Masks` carries the arrays of a call that decide it; the static parts (causal, the
window) are arguments.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Masks(NamedTuple):
    """The arrays of a call that leave logits out (each None when absent).

    Attributes:
      mask: boolean `[B|1, N|1, T|1, S|1]`, True where a query may attend.
      q_lengths, kv_lengths: `[B]` int32 valid lengths (padding after).
      q_segments, kv_segments: `[B, T]` and `[B, S]` int32 document ids: a query
        attends to the keys of its own document.
    """

    mask: jax.Array | None = None
    q_lengths: jax.Array | None = None
    kv_lengths: jax.Array | None = None
    q_segments: jax.Array | None = None
    kv_segments: jax.Array | None = None

    @property
    def has_mask(self) -> bool:
        """A mask goes to the libraries: the user's, or the segment ids as one."""
        return self.mask is not None or self.q_segments is not None


def large_negative(dtype: Any) -> jax.Array:
    """What a left-out logit becomes: finite, so a row with every logit left out gives
    equal weights (as `jax.nn.dot_product_attention` does) rather than NaNs."""
    limit = min(float(jnp.finfo(dtype).max), float(jnp.finfo(np.float32).max))
    return jnp.asarray(-0.7 * limit, dtype=dtype)


def keep(
    q_pos: jax.Array,
    k_pos: jax.Array,
    masks: Masks,
    *,
    causal: bool,
    window: tuple[int, int] | None,
) -> jax.Array | None:
    """Which logits `[B|1, 1|N, len(q_pos), len(k_pos)]` take part, or None when all do.

    `masks.mask` and the segment ids must already be cut to these positions (the
    queries' rows and the keys' columns); the lengths are per batch row.
    """
    out: jax.Array | None = masks.mask

    def both(m: jax.Array) -> jax.Array:
        return m if out is None else jnp.logical_and(out, m)

    rows, cols = q_pos[:, None], k_pos[None, :]
    if causal:
        out = both((rows >= cols)[None, None])
    if window is not None:
        left, right = window
        out = both(((rows <= cols + left) & (rows >= cols - right))[None, None])
    if masks.q_lengths is not None:
        out = both((q_pos[None, :, None] < masks.q_lengths[:, None, None])[:, None])
    if masks.kv_lengths is not None:
        out = both((k_pos[None, None, :] < masks.kv_lengths[:, None, None])[:, None])
    if masks.q_segments is not None and masks.kv_segments is not None:
        same = masks.q_segments[:, :, None] == masks.kv_segments[:, None, :]
        out = both(same[:, None])
    return out


def segments_as_mask(masks: Masks) -> jax.Array | None:
    """The user's mask and the segment ids as one boolean `[B|1, N|1, T, S]` mask, for
    the libraries that take a mask but not segment ids (cuDNN, tokamax)."""
    if masks.q_segments is None or masks.kv_segments is None:
        return masks.mask
    same = (masks.q_segments[:, :, None] == masks.kv_segments[:, None, :])[:, None]
    return same if masks.mask is None else jnp.logical_and(masks.mask, same)


def document_ranges(masks: Masks) -> tuple[jax.Array, jax.Array] | None:
    """For each query, the keys `[start, end)` that can share its segment id, as two
    int32 `[B, 1, T]` arrays, or None without segment ids.

    Where a batch row's kv segment ids never decrease (documents packed one after
    another, the usual layout) the range holds exactly the keys of the query's
    document, so a kernel that skips blocks outside it does a document's work instead
    of the whole sequence's. Elsewhere it is every key: the ids must still be applied
    as a mask, and this only says which blocks can be skipped.
    """
    q, kv = masks.q_segments, masks.kv_segments
    if q is None or kv is None:
        return None
    start, end = key_ranges(kv, q, q, method="sort")
    return start[:, None, :], end[:, None, :]


def key_ranges(
    kv: jax.Array, low: jax.Array, high: jax.Array, *, method: str
) -> tuple[jax.Array, jax.Array]:
    """For each pair of segment ids `low <= high` (`[B, M]` each), the keys `[start,
    end)` whose ids lie between them, as two int32 `[B, M]`, where the batch row's kv
    ids `[B, S]` never decrease; elsewhere every key. `method` is `jnp.searchsorted`'s,
    never its default: that is a loop whose every step waits on a GPU (about 0.35 ms a
    search at 8k tokens on an H200). "sort" suits many pairs, "compare_all" few."""

    def row(kv_row: jax.Array, low_row: jax.Array, high_row: jax.Array):
        return (
            jnp.searchsorted(kv_row, low_row, side="left", method=method),
            jnp.searchsorted(kv_row, high_row, side="right", method=method),
        )

    start, end = jax.vmap(row)(kv, low, high)
    ordered = jnp.all(kv[:, 1:] >= kv[:, :-1], axis=1, keepdims=True)
    start = jnp.where(ordered, start, 0).astype(jnp.int32)
    end = jnp.where(ordered, end, kv.shape[1]).astype(jnp.int32)
    return start, end
