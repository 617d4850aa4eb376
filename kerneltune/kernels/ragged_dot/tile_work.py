"""How much multiply work a config's tiles do at a call's sizes, as a multiple of the
call's own: what carries a tuned call's timings to another size.

A tile that sticks out of the matrix is computed whole. So a config timed fastest at
one size can waste a tenth of its work at another: 128×256 tiles over 1408 columns
compute 1536 (9% more), where 128×128 tiles fit exactly. The prediction of a config for
a new size (`kerneltune/_src/selection/prediction.py`) scales each tuned call's timing
of a config by the ratio of its work here to its work there.

Counted: the output's columns and the contracted axis (forward and d_lhs), the `K × N`
output tiles (d_rhs), for the Triton and Mosaic backends; the plain-JAX and tokamax
backends have no model (1). Not counted: the rows. Group sizes are data, absent from
the key, and how row tiles meet group boundaries differs by kernel (Triton computes a
tile once per group it holds rows of, JAX's Mosaic kernel `ceil(M / block_m) + G - 1`
tiles wherever the groups lie). Counted per group for the balanced routing the keys are
tuned with, the leave-one-out replay of the H200 table (`benchmarks/
prediction_regret.py`, BENCHMARKS.md 2026-12-07) put a key 9% further behind and the
timed shortlist's worst 5% → 15%: at 32 rows an expert the fastest config has 64-row
tiles, twice the rows' work, and beats 32-row tiles by 16%.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from kerneltune.kernels.ragged_dot.config import Product


def _padded(size: int, block: int) -> float:
    """`size` rounded up to whole blocks, over `size`."""
    return -(-size // block) * block / size


def dims(product: Product, sizes: Sequence[int]) -> tuple[int, int] | None:
    """The two tiled axes of a call from its key's sizes (the dims of its arrays in
    order, `CallShape.sizes`), in the order of the config's blocks that tile them:
    forward `lhs[M, K], rhs[G, K, N], group_sizes[G]` → `(N, K)` (`block_n`, `block_k`);
    d_lhs `d_out[M, N], rhs[G, K, N], group_sizes[G]` → `(K, N)` (`block_n`, `block_k`);
    d_rhs `lhs[M, K], d_out[M, N], group_sizes[G]` → `(K, N)` (`block_m`, `block_n`).
    None when the sizes are not a call of `product`."""
    if product == "drhs":
        return (sizes[1], sizes[3]) if len(sizes) >= 5 else None
    if len(sizes) < 6:
        return None
    _, first, _, k, n, _ = sizes[:6]
    return (n, first) if product == "fwd" else (k, first)


def padded_work(product: Product, cfg: Any, sizes: Sequence[int]) -> float:
    """The multiply work `cfg` does at a call of `sizes` over the call's own (1.0: no
    model for the backend, or sizes that are not the product's)."""
    field = cfg.get if isinstance(cfg, Mapping) else lambda name: getattr(cfg, name, None)
    found = dims(product, sizes)
    if field("backend") not in ("triton", "mosaic") or found is None:
        return 1.0
    names = ("block_m", "block_n") if product == "drhs" else ("block_n", "block_k")
    work = 1.0
    for size, name in zip(found, names, strict=True):
        block = field(name)
        if not isinstance(block, numbers.Integral) or isinstance(block, bool):
            return 1.0
        work *= _padded(max(int(size), 1), max(int(block), 1))
    return work
