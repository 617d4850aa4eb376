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
from collections.abc import Sequence
from typing import Any

from kerneltune._src.core.configs import config_to_dict
from kerneltune.kernels.ragged_dot.config import Product, dims


def _padded(size: int, block: int) -> float:
    """`size` rounded up to whole blocks, over `size`."""
    return -(-size // block) * block / size


def padded_work(product: Product, cfg: Any, sizes: Sequence[int]) -> float:
    """The multiply work `cfg` does at a call of `sizes` over the call's own (1.0: no
    model for the backend, or sizes that are not the product's)."""
    fields = config_to_dict(cfg)
    found = dims(product, sizes)
    if fields.get("backend") not in ("triton", "mosaic") or found is None:
        return 1.0
    names = ("block_m", "block_n") if product == "drhs" else ("block_n", "block_k")
    work = 1.0
    for size, name in zip(found, names, strict=True):
        block = fields.get(name)
        if not isinstance(block, numbers.Integral) or isinstance(block, bool):
            return 1.0
        work *= _padded(max(int(size), 1), max(int(block), 1))
    return work
