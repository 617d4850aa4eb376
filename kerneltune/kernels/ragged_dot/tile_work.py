"""How much multiply work a config's tiles do at a call's sizes, as a multiple of the
call's own `M·K·N`: what carries a tuned call's timings to another size.

A tile that sticks out of the matrix, or a row tile shared by two groups, is computed
whole. So a config timed fastest at one size can waste a tenth of its work at
another: 128×256 tiles over 1408 columns compute 1536 (9% more), where 128×128 tiles fit
exactly. The prediction of a config for a new size (`kerneltune/_src/selection/
prediction.py`) scales each tuned call's timing of a config by the ratio of its work
here to its work there. Group sizes are data, absent from the key: the work is counted
for the balanced routing the keys are tuned with (`shapes.balanced`).

Per product and backend, in tiles of `block_m × block_n` output and `block_k` steps:

- forward and d_lhs: each group's rows in tiles of `block_m` (a tile over a group
  boundary is computed once per group it holds rows of), as the Triton kernel does
  (its idle programs multiply nothing). JAX's Mosaic kernel runs `ceil(M / block_m) +
  G - 1` row tiles wherever the groups lie (`pallas_mosaic`'s docstring), but counted
  so the leave-one-out replay of the H200 table (`benchmarks/prediction_regret.py`)
  put 6 keys further behind and 4 nearer; counted per group as Triton's, 1 and 4
  (BENCHMARKS.md, 2026-12-07): its surplus tiles cost less than a tile of work;
- d_rhs (both): each group's `[K, N]` output in tiles, its rows walked in steps of
  `block_k` from the group's first row;
- the plain-JAX and tokamax backends: no model, 1.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from kerneltune.kernels.ragged_dot.config import Product
from kerneltune.kernels.ragged_dot.shapes import balanced


def _ceil_to(x: int, block: int) -> int:
    return -(-x // block) * block


def dims(product: Product, sizes: Sequence[int]) -> tuple[int, int, int, int] | None:
    """`(rows, output columns, contracted, groups)` of a call from its key's sizes (the
    dims of its arrays in order, `CallShape.sizes`); None when they are not a call of
    `product`. Forward `lhs[M, K], rhs[G, K, N], group_sizes[G]`; d_lhs `d_out[M, N],
    rhs[G, K, N], group_sizes[G]`; d_rhs `lhs[M, K], d_out[M, N], group_sizes[G]`, whose
    rows are contracted and `(K, N)` is the output tile."""
    if product == "drhs":
        if len(sizes) < 5:
            return None
        m, k, _, n, g = sizes[:5]
        return k, n, m, g
    if len(sizes) < 6:
        return None
    m, first, _, k, n, g = sizes[:6]
    return (m, n, first, g) if product == "fwd" else (m, k, first, g)


@functools.lru_cache(maxsize=4096)
def _group_row_tiles(m: int, g: int, block: int) -> int:
    """Row tiles of `block` rows that `g` balanced groups of `m` rows cover, each group
    counting every tile it touches."""
    tiles, start = 0, 0
    for rows in balanced(m, g):
        rows = int(rows)
        if rows:
            tiles += (start + rows - 1) // block - start // block + 1
        start += rows
    return tiles


@functools.lru_cache(maxsize=4096)
def _group_steps(m: int, g: int, block: int) -> int:
    """Steps of `block` rows that walking each of `g` balanced groups from its own first
    row takes."""
    return sum(-(-int(rows) // block) for rows in balanced(m, g))


def padded_work(product: Product, cfg: Any, sizes: Sequence[int]) -> float:
    """The multiply work `cfg` does at a call of `sizes` over the call's `M·K·N`
    (1.0: no model for the backend, or sizes that are not the product's)."""
    field = cfg.get if isinstance(cfg, Mapping) else lambda name: getattr(cfg, name, None)
    blocks = [field(name) for name in ("block_m", "block_n", "block_k")]
    found = dims(product, sizes)
    if field("backend") not in ("triton", "mosaic") or found is None:
        return 1.0
    if not all(isinstance(b, int) and b > 0 for b in blocks):
        return 1.0
    bm, bn, bk = (int(b) for b in blocks if b is not None)
    rows, cols, red, groups = (max(int(x), 1) for x in found)
    if product == "drhs":
        walked = _group_steps(red, groups, bk) * bk
        return _ceil_to(rows, bm) * _ceil_to(cols, bn) * walked / (rows * cols * red)
    row_tiles = _group_row_tiles(rows, groups, bm)
    return row_tiles * bm * _ceil_to(cols, bn) * _ceil_to(red, bk) / (rows * cols * red)
