"""How a call to the Mosaic GPU flash kernels is laid out: the static shape of the
kernels (`FlashShape`), the rows a warpgroup holds, and which blocks each block of
queries or keys has to visit (`block_ranges`), computed in XLA before the kernels run
from the call's lengths, window and documents.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kerneltune.kernels.attention.masking import Masks, key_ranges

#: Query rows one warpgroup computes (wgmma's M).
WARPGROUP_ROWS = 64
#: A row's log-sum-exp below this kept no key (the forward kernel's output for such rows).
EMPTY_LSE = -1e29


@dataclasses.dataclass(frozen=True)
class FlashShape:
    """What the kernels are compiled for.

    Attributes:
      block_q, block_kv: rows of queries and of keys a step holds (multiples of 64).
      head_dim: the heads' width (a multiple of 64).
      groups: query heads per key head.
      causal, window, soft_cap, scale: the variant (`window` a `(left, right)` pair).
      segmented: whether segment ids are given.
      heads_outermost: the launch order (`grid`): each row of `in_work_order` for
        every head, one order over all the heads' blocks (the default), or each head's
        blocks in turn. One order was 1-10% faster in the forward and 1-23% in the
        backward at 8k and 16k tokens (H200, `benchmarks/mosaic_attention_parts_gpu.py`):
        each head's longest blocks start first, where in turn the last head's started
        after every other head's short ones.
    """

    block_q: int
    block_kv: int
    head_dim: int
    groups: int
    causal: bool
    window: tuple[int, int] | None
    soft_cap: float | None
    scale: float
    segmented: bool
    heads_outermost: bool = False


def grid(
    shape: FlashShape, heads: int, rows: int, batch: int, rows_name: str
) -> tuple[tuple[int, int, int], tuple[str, str, str]]:
    """A kernel's grid and its axes' names for `heads` x `rows` (of `in_work_order`) x
    `batch` blocks. Mosaic GPU launches a grid's first dimension slowest, so with
    `shape.heads_outermost` a head's rows go in work order before the next head's;
    without it every head's block of a row goes before the next row's."""
    if shape.heads_outermost:
        return (heads, rows, batch), ("heads", rows_name, "batch")
    return (rows, heads, batch), (rows_name, "heads", "batch")


def block_ranges(
    shape: FlashShape, lens: jax.Array, masks: Masks, t: int, s: int
) -> tuple[jax.Array, jax.Array]:
    """Which blocks each block visits, as int32 `[B, T / block_q, 4]` (for each block
    of queries, key blocks) and `[B, S / block_kv, 4]` (for each block of keys, query
    blocks): `[lo, hi)` can hold a kept logit (for a key block: every query block
    between the first and the last whose range holds it); `[full_lo, full_hi)` within
    it is the first run of blocks where every logit is kept, which the kernels visit
    without masking. `lens` is `[B, 2]` (the valid query and key lengths); `masks`
    carries the segment ids (or none); `t`, `s` the padded lengths."""
    bq, bkv = shape.block_q, shape.block_kv
    nq, nk = t // bq, s // bkv
    first = jnp.arange(nq, dtype=jnp.int32) * bq  # each block's first query
    last = first + bq - 1
    q_len, kv_len = lens[:, 0:1], lens[:, 1:2]
    lo_pos = jnp.zeros((lens.shape[0], nq), jnp.int32)
    hi_pos = jnp.broadcast_to(kv_len, (lens.shape[0], nq))
    if shape.causal:
        hi_pos = jnp.minimum(hi_pos, last[None] + 1)
    if shape.window is not None:
        left, right = shape.window
        lo_pos = jnp.maximum(lo_pos, first[None] - left)
        hi_pos = jnp.minimum(hi_pos, last[None] + right + 1)
    docs = _document_blocks(masks, q_len, nq, bq)
    if docs is not None:
        lo_pos, hi_pos = jnp.maximum(lo_pos, docs[0]), jnp.minimum(hi_pos, docs[1])
    hi_pos = jnp.where(first[None] < q_len, hi_pos, 0)  # blocks of padding only
    lo = lo_pos // bkv
    hi = jnp.maximum(pl.cdiv(hi_pos, bkv), lo)
    j = jnp.arange(nk, dtype=jnp.int32)
    touches = (j >= lo[..., None]) & (j < hi[..., None])  # [B, nq, nk]
    whole = _whole_blocks(shape, lens, masks, nq, nk) & touches
    kv_ranges = jnp.stack([lo, hi, *_first_run(whole, lo, hi, axis=2)], axis=-1)
    i = jnp.arange(nq, dtype=jnp.int32)[None, :, None]
    q_lo = jnp.min(jnp.where(touches, i, nq), axis=1)
    q_hi = jnp.max(jnp.where(touches, i + 1, 0), axis=1)
    q_lo = jnp.minimum(q_lo, q_hi)
    q_ranges = jnp.stack([q_lo, q_hi, *_first_run(whole, q_lo, q_hi, axis=1)], axis=-1)
    return kv_ranges.astype(jnp.int32), q_ranges.astype(jnp.int32)


#: The column of `in_work_order`'s rows that holds the row's block.
BLOCK = 4


def in_work_order(ranges: jax.Array) -> jax.Array:
    """`block_ranges`' rows (`[B, n, 4]`) in the order the kernels take them, the
    blocks with the most visits first, each with its block's index as a fifth column
    (`BLOCK`): `[B, n, 5]`. Grid step `i` of a kernel computes row `i`'s block.

    The GPU starts a grid's blocks in order, each when a slot frees, so a long block
    started last is the kernel's tail. In position order that is what a causal call
    does: its last query blocks visit the most key blocks, and each document's last
    blocks do with packed documents. The kernels' grids (`grid`) launch each row of
    this order for every head before the next row, so every head's longest blocks go
    first. On an H200 at 8k tokens (BENCHMARKS.md, 2026-11-29) that made the forward
    kernel 4-12% and the backward kernels 5-23% faster than position order; the same
    order taken head by head gained half as much or less. Ties keep
    position order."""
    count = ranges[..., 1] - ranges[..., 0]
    order = jnp.argsort(-count, axis=1, stable=True).astype(jnp.int32)
    rows = jnp.take_along_axis(ranges, order[..., None], axis=1)
    return jnp.concatenate([rows, order[..., None]], axis=-1)


def _document_blocks(masks: Masks, q_len: jax.Array, nq: int, bq: int):
    """For each block of queries, the keys `[start, end)` that can share a segment id
    with one of its valid queries, as two int32 `[B, nq]`; `[s, 0)` for a block of
    padding only; None without segment ids. What `masking.document_ranges` gives each
    query, taken over the block: where the kv ids never decrease (packed documents),
    the keys of the block's documents, else every key.

    The lowest and highest valid id of a block bound its documents' keys: two
    searches a block, by comparison with every key (one fused reduction), where a search
    per query ran before; on a GPU those searches took about 0.7 ms at 8k tokens (an
    H200), ten times the forward kernel at 16 documents."""
    q, kv = masks.q_segments, masks.kv_segments
    if q is None or kv is None:
        return None
    s = kv.shape[1]
    valid = (jnp.arange(q.shape[1])[None] < q_len).reshape(-1, nq, bq)
    ids = q.reshape(-1, nq, bq)
    info = jnp.iinfo(ids.dtype)
    lowest = jnp.where(valid, ids, info.max).min(axis=2)  # [B, nq]
    highest = jnp.where(valid, ids, info.min).max(axis=2)
    start, end = key_ranges(kv, lowest, highest, method="compare_all")
    some = valid.any(axis=2)
    return jnp.where(some, start, s), jnp.where(some, end, 0)


def _first_run(whole: jax.Array, lo: jax.Array, hi: jax.Array, axis: int):
    """Along `axis` of `whole` `[B, nq, nk]`, the first run of True `[start, end)`, or
    `[hi, hi)` where there is none (`lo`, `hi` without `axis`)."""
    n = whole.shape[axis]
    idx = jnp.arange(n, dtype=jnp.int32)
    idx = idx[None, :, None] if axis == 1 else idx[None, None, :]
    start = jnp.min(jnp.where(whole, idx, n), axis=axis)
    start = jnp.minimum(start, hi)
    after = ~whole & (idx > jnp.expand_dims(start, axis))
    end = jnp.minimum(jnp.min(jnp.where(after, idx, n), axis=axis), hi)
    return start, jnp.maximum(end, start)


def _whole_blocks(shape: FlashShape, lens: jax.Array, masks: Masks, nq: int, nk: int) -> jax.Array:
    """`[B, nq, nk]`: True where every logit of a query block against a key block is
    kept (no position, length or document leaves one out)."""
    bq, bkv = shape.block_q, shape.block_kv
    q_first = (jnp.arange(nq, dtype=jnp.int32) * bq)[:, None]
    q_last = q_first + bq - 1
    k_first = (jnp.arange(nk, dtype=jnp.int32) * bkv)[None, :]
    k_last = k_first + bkv - 1
    full = (q_last < lens[:, 0, None, None]) & (k_last < lens[:, 1, None, None])
    if shape.causal:
        full &= (k_last <= q_first)[None]
    if shape.window is not None:
        left, right = shape.window
        full &= ((k_first >= q_last - left) & (k_last <= q_first + right))[None]
    if masks.q_segments is not None and masks.kv_segments is not None:
        qs = masks.q_segments.reshape(-1, nq, bq)
        ks = masks.kv_segments.reshape(-1, nk, bkv)
        # Whole only where both blocks hold one document, the same one (a flag per
        # block, not a sentinel id: any integer is a document's id).
        q_doc, k_doc = qs.min(axis=2), ks.min(axis=2)
        q_one, k_one = q_doc == qs.max(axis=2), k_doc == ks.max(axis=2)
        same = q_doc[:, :, None] == k_doc[:, None, :]
        full &= q_one[:, :, None] & k_one[:, None, :] & same
    return full


@dataclasses.dataclass(frozen=True)
class Visits:
    """The blocks `[lo, hi)` a block visits, in the order the kernels take them: the
    masked ones first (those before the run of whole blocks `[full_lo, full_hi)`, then
    those after it), then the whole ones. So every masked step shares one loop body and
    every unmasked step another: a kernel compiles two bodies, not three.

    The kernels count their steps `n` in this order (`0 <= n < count`), fetch the block
    of step `n + 1` while computing step `n`, and alternate slots by `n % 2`."""

    lo: jax.Array
    hi: jax.Array
    full_lo: jax.Array
    full_hi: jax.Array

    @classmethod
    def read(cls, ranges_ref, b, i) -> Visits:
        """Row `i` of batch row `b` of `block_ranges`'s output (or of `in_work_order`'s),
        read in a kernel (its first columns are `lo, hi, full_lo, full_hi`, this
        class's fields' order)."""
        return cls(*(ranges_ref[b, i, c] for c in range(4)))

    @classmethod
    def of_step(cls, ranges_ref, b, axis: str) -> tuple[jax.Array, Visits]:
        """The block this grid step computes and its visits: the row of batch row `b`
        of `in_work_order`'s output at the step's index along grid axis `axis` (longest
        first), read in a kernel."""
        row = jax.lax.axis_index(axis)
        return ranges_ref[b, row, BLOCK], cls.read(ranges_ref, b, row)

    @property
    def count(self) -> jax.Array:
        return self.hi - self.lo

    @property
    def masked(self) -> jax.Array:
        return (self.full_lo - self.lo) + (self.hi - self.full_hi)

    def block(self, n: jax.Array) -> jax.Array:
        """The block of step `n`."""
        left = self.full_lo - self.lo
        masked = self.masked
        return jnp.where(
            n < left,
            self.lo + n,
            jnp.where(n < masked, self.full_hi + (n - left), self.full_lo + (n - masked)),
        )

    def run(self, step, carry):
        """`step(n, carry, masked)` over the steps, masked ones first."""
        masked = self.masked
        carry = jax.lax.fori_loop(0, masked, functools.partial(step, masked=True), carry)
        return jax.lax.fori_loop(masked, self.count, functools.partial(step, masked=False), carry)
