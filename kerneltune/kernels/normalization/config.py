"""The normalizations' config, heuristic (JAX's) and candidate space."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from kerneltune._src.core.configs import config_to_dict
from kerneltune._src.params import check_positive_power_of_two
from kerneltune.kernels._common import Pruned, RowsProblem, next_power_of_2, powers_of_2, prune


@dataclasses.dataclass(frozen=True, kw_only=True)
class NormConfig:
    """Launch parameters of a row-wise normalization kernel (one program per row).

    Attributes:
      block_size: how many elements of the row each loop step loads.
      num_warps: warps per program.

    Example:
      >>> NormConfig(block_size=1024, num_warps=4)
      NormConfig(block_size=1024, num_warps=4, backend='pallas')
    """

    block_size: int = 1024
    num_warps: int = 4
    #: "pallas" (the kernel above) or "xla" (JAX's fusion; the block fields unused).
    backend: str = "pallas"

    def __post_init__(self) -> None:
        if self.backend not in ("pallas", "xla"):
            raise ValueError(f"NormConfig.backend must be 'pallas' or 'xla', got {self.backend!r}.")
        check_positive_power_of_two("NormConfig", "block_size", self.block_size)
        check_positive_power_of_two("NormConfig", "num_warps", self.num_warps)


NormProblem = RowsProblem


def heuristic(p: NormProblem) -> NormConfig:
    """JAX's own choice: the row (at most 64 KiB of it, between 128 and 4096
    elements) in one block, a warp per 256 elements (1 to 8)."""
    block = min(65536 // np.dtype(p.dtype).itemsize, next_power_of_2(p.n))
    block = min(max(block, 128), 4096)
    return NormConfig(block_size=block, num_warps=min(max(block // 256, 1), 8))


#: What a Pallas block that holds the whole row is called when configs of rows of
#: different widths are compared (`across_widths`).
WHOLE_ROW = "whole row"


def across_widths(cfg: Any, width: int) -> dict[str, Any]:
    """`cfg`'s fields (of rows of `width` elements) as they compare across widths: a
    Pallas `block_size` that holds the whole row is `WHOLE_ROW` (the row read once, no
    loop over blocks) at any width, where 1024 elements are the whole of a 1024-wide
    row and a quarter of a 4096-wide one. Leave-one-out over the H100 table (BENCHMARKS.md,
    2026-12-07): RMS norm 1.8% / 21.8% -> 0.4% / 14.3% behind the best, layer norm 1.0% /
    10.0% -> 0.0% / 8.0%; 8 keys nearer, 2 further."""
    fields = config_to_dict(cfg)
    block = fields.get("block_size")
    if fields.get("backend") == "pallas" and isinstance(block, int):
        if block >= _row_block(width):
            fields["block_size"] = WHOLE_ROW
    return fields


def _row_block(width: int) -> int:
    """The smallest block that holds a row of `width` elements (128 at least)."""
    return max(128, next_power_of_2(max(width, 1)))


def rules(p: NormProblem):
    def covers_row(c: NormConfig) -> str | None:
        if c.block_size > _row_block(p.n):
            return f"block_size={c.block_size} is larger than the row ({p.n}): masked lanes only"
        return None

    def threads(c: NormConfig) -> str | None:
        per_thread = c.block_size // (32 * c.num_warps)
        if per_thread < 1:
            return (
                f"{c.num_warps} warps have more threads than block_size={c.block_size} has elements"
            )
        if per_thread > 64:
            return f"{per_thread} elements per thread per step with {c.num_warps} warps: register spills"
        return None

    def precision(c: NormConfig) -> str | None:
        if np.dtype(p.dtype).itemsize > 4:
            return f"{np.dtype(p.dtype)} rows: the Pallas kernel computes in float32"
        return None

    return [precision, covers_row, threads]


def candidates(p: NormProblem) -> tuple[list[NormConfig], list[Pruned[NormConfig]]]:
    """Candidates that make sense for rows of `p.n` elements, and the pruned ones.

    Example:
      >>> import numpy as np
      >>> kept, _ = candidates(NormProblem(4096, 4096, np.dtype("bfloat16")))
      >>> heuristic(NormProblem(4096, 4096, np.dtype("bfloat16"))) in kept
      True
    """
    space = [
        NormConfig(block_size=b, num_warps=w)
        for b, w in itertools.product(powers_of_2(128, 8192), (1, 2, 4, 8, 16))
    ]
    kept, pruned = prune(space, rules(p), what=f"norm rows={p.rows} n={p.n}")
    h = heuristic(p)
    if h not in kept and np.dtype(p.dtype).itemsize <= 4:  # float64: XLA alone
        kept.insert(0, h)
    return [XLA, *kept], pruned


#: XLA's own fusion of the norm: on H100s within ±10% of the best Pallas config, and
#: ahead at most widths, so it is the GPU heuristic and the first candidate.
XLA = NormConfig(backend="xla")


def interpret_candidates(p: NormProblem) -> list[NormConfig]:
    """A few block sizes for the Pallas interpreter (tests, the CPU demo); XLA alone
    for float64 rows (the Pallas kernel computes in float32)."""
    if np.dtype(p.dtype).itemsize > 4:
        return [XLA]
    out = [heuristic(p)]
    for b in (128, 512):
        c = NormConfig(block_size=b, num_warps=4)
        if c not in out and b <= max(128, next_power_of_2(p.n)):
            out.append(c)
    return out
