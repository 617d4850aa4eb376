"""The softmax's config: the Pallas softmax has one knob, its warp count."""

from __future__ import annotations

import dataclasses
from typing import Any

from kerneltune._src.core.configs import config_to_dict
from kerneltune._src.params import check_positive_power_of_two
from kerneltune.kernels._common import Pruned, RowsProblem, next_power_of_2, prune


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoftmaxConfig:
    """Launch parameters of the Pallas softmax (one program per row; the whole row,
    padded to a power of two, is loaded at once).

    Example:
      >>> SoftmaxConfig(num_warps=8)
      SoftmaxConfig(num_warps=8)
    """

    num_warps: int = 4

    def __post_init__(self) -> None:
        check_positive_power_of_two("SoftmaxConfig", "num_warps", self.num_warps)


SoftmaxProblem = RowsProblem


#: The heuristic's warps by the row's padded width: the fewest warps whose row is at
#: most this wide. From the shipped tables' exhaustive timings (bf16, H100 and H200,
#: 4096 and 16384 rows of 1024 to 32768; 2026-12-06): 1 warp won or was within 3.2% up
#: to 2048 elements, 4 at 4096 (within 3.3%), 8 at 8192 and 16384, 16 at 32768. JAX's
#: default of 4 warps at every width was 14-25% behind at 1024 on both GPUs, up to 10.5%
#: at 2048 and 35% at 32768 on the H200, and at most 3% ahead of this rule anywhere
#: (`benchmarks/softmax_heuristic_replay.py`).
WARPS_UP_TO_WIDTH = ((1, 2048), (4, 4096), (8, 16384), (16, 131072))


def heuristic(p: SoftmaxProblem) -> SoftmaxConfig:
    """Warps by the row's width (`WARPS_UP_TO_WIDTH`); 32 beyond it.

    Example:
      >>> import numpy as np
      >>> [heuristic(SoftmaxProblem(4096, n, np.dtype("bfloat16"))).num_warps
      ...  for n in (1000, 4096, 8192, 32768, 262144)]
      [1, 4, 8, 16, 32]
    """
    row = next_power_of_2(p.n)
    warps = next((w for w, widest in WARPS_UP_TO_WIDTH if row <= widest), 32)
    return SoftmaxConfig(num_warps=warps)


def across_widths(cfg: Any, width: int) -> dict[str, Any]:
    """`cfg`'s fields (of rows of `width` elements) as they compare across widths: the
    warp count as the row elements each thread holds (the row padded to a power of two
    over the threads). One program holds a whole row, so 2 warps over 2048 elements and
    1 warp over 1024 each give a thread 32 elements; the winners at other widths of the
    same rows tell more as elements a thread than as warps. Leave-one-out over the
    shipped tables (BENCHMARKS.md, 2026-12-07): H100 0.0% / 24.9% (median / worst behind
    the best) -> 0.5% / 4.1%, H200 0.0% / 4.7% -> 0.7% / 7.9%."""
    fields = config_to_dict(cfg)
    warps = fields.get("num_warps")
    if isinstance(warps, int) and warps > 0:
        del fields["num_warps"]
        fields["elements_per_thread"] = _per_thread(width, warps)
    return fields


def _per_thread(width: int, warps: int) -> int:
    """The row elements each thread holds: the row padded to a power of two over the
    threads of `warps` warps (0 where there are more threads than elements)."""
    return next_power_of_2(max(width, 1)) // (32 * warps)


def rules(p: SoftmaxProblem):
    row = next_power_of_2(p.n)

    def threads(c: SoftmaxConfig) -> str | None:
        per_thread = _per_thread(p.n, c.num_warps)
        if per_thread < 1:
            return f"{c.num_warps} warps have more threads than the row ({row} padded) has elements"
        if per_thread > 256:
            return f"{per_thread} row elements per thread with {c.num_warps} warps: register spills"
        return None

    return [threads]


def candidates(p: SoftmaxProblem) -> tuple[list[SoftmaxConfig], list[Pruned[SoftmaxConfig]]]:
    """Warp counts that make sense for rows of `p.n` elements, and the pruned ones.

    Example:
      >>> import numpy as np
      >>> kept, pruned = candidates(SoftmaxProblem(16, 64, np.dtype("float32")))
      >>> [c.num_warps for c in kept], len(pruned)
      ([1, 2], 4)
    """
    space = [SoftmaxConfig(num_warps=w) for w in (1, 2, 4, 8, 16, 32)]
    kept, pruned = prune(space, rules(p), what=f"softmax rows={p.rows} n={p.n}")
    if not kept:
        kept = [heuristic(p)]
    return kept, pruned


def interpret_candidates(p: SoftmaxProblem) -> list[SoftmaxConfig]:
    """The interpreter ignores warps: one candidate is enough to exercise the path."""
    return [heuristic(p)]
