"""The matmul's config, its heuristic, and its candidate space pruned by what fits."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from kerneltune._src.params import check_positive, check_positive_power_of_two
from kerneltune.kernels._common import (
    MAX_REGISTERS_PER_THREAD,
    Pruned,
    next_power_of_2,
    prune,
    shared_memory_limit,
)

#: The smallest tile side Triton's `dot` accepts.
MIN_BLOCK = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatmulConfig:
    """Launch parameters of the Pallas matmul.

    Attributes:
      bm, bn: the output tile each program computes (rows, columns).
      bk: how many columns of `x` (rows of `y`) one step of the inner loop multiplies.
      num_warps: warps per program.
      num_stages: software-pipelining depth of the inner loop (Triton).
      group_m: output tiles are visited in groups of this many tile rows, so that
        programs running at the same time share rows of `x` and columns of `y` in L2;
        1 visits tiles row by row.

    Example:
      >>> MatmulConfig(bm=128, bn=128, bk=64, num_warps=4, num_stages=3)
      MatmulConfig(bm=128, bn=128, bk=64, num_warps=4, num_stages=3, group_m=8)
      >>> MatmulConfig(bm=96)
      Traceback (most recent call last):
      ...
      ValueError: MatmulConfig.bm must be a positive power of two, got 96.
    """

    bm: int = 128
    bn: int = 128
    bk: int = 64
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8

    def __post_init__(self) -> None:
        for name in ("bm", "bn", "bk"):
            value = getattr(self, name)
            check_positive_power_of_two("MatmulConfig", name, value)
            if value < MIN_BLOCK:
                raise ValueError(
                    f"MatmulConfig.{name} must be at least {MIN_BLOCK} (the smallest tile "
                    f"Triton's dot accepts), got {value}."
                )
        check_positive_power_of_two("MatmulConfig", "num_warps", self.num_warps)
        check_positive_power_of_two("MatmulConfig", "group_m", self.group_m)
        check_positive("MatmulConfig", "num_stages", self.num_stages)


@dataclasses.dataclass(frozen=True)
class MatmulProblem:
    """What the config depends on: `x[m, k] @ y[k, n]` in `dtype`."""

    m: int
    n: int
    k: int
    dtype: np.dtype

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize


def _block_for(dim: int, preferred: int) -> int:
    """`preferred`, or the smallest power of two covering a smaller `dim`."""
    return max(MIN_BLOCK, min(preferred, next_power_of_2(dim)))


def shared_memory_bytes(p: MatmulProblem, cfg: MatmulConfig) -> int:
    """Shared memory the pipelined inner loop holds: one `x` tile and one `y` tile per
    stage. (Triton reuses those buffers for the epilogue.)"""
    return cfg.num_stages * (cfg.bm * cfg.bk + cfg.bk * cfg.bn) * p.itemsize


def accumulator_registers(cfg: MatmulConfig) -> int:
    """32-bit registers per thread that the float32 accumulator tile alone needs."""
    return cfg.bm * cfg.bn // (32 * cfg.num_warps)


def heuristic(p: MatmulProblem) -> MatmulConfig:
    """A config that fits and is reasonable for any shape: 128×128 tiles (256 wide
    for large bf16 problems, where they pay off), bk=64 for 16-bit inputs and 32 for
    32-bit ones, 3 stages (fewer if they would not fit)."""
    wide = p.itemsize <= 2 and p.m >= 2048 and p.n >= 2048
    bm = _block_for(p.m, 128)
    bn = _block_for(p.n, 256 if wide else 128)
    bk = _block_for(p.k, 64 if p.itemsize <= 2 else 32)
    num_warps = 8 if bm * bn >= 128 * 256 else 4
    cfg = MatmulConfig(bm=bm, bn=bn, bk=bk, num_warps=num_warps, num_stages=3)
    while cfg.num_stages > 1 and shared_memory_bytes(p, cfg) > shared_memory_limit():
        cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def candidate_space(p: MatmulProblem) -> list[MatmulConfig]:
    """Every config considered before pruning. Small tiles are only offered for
    small dimensions, where large ones would mostly compute padding."""
    bms = [b for b in (16, 32, 64, 128, 256) if b >= 64 or p.m <= 256]
    bns = [b for b in (32, 64, 128, 256) if b >= 64 or p.n <= 256]
    bks = (32, 64, 128)
    return [
        MatmulConfig(bm=bm, bn=bn, bk=bk, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in itertools.product(bms, bns, bks, (4, 8), (2, 3, 4))
    ]


def rules(p: MatmulProblem, smem_limit: int | None = None):
    """The pruning rules for problem `p`: each returns None or why a config is out."""
    limit = shared_memory_limit() if smem_limit is None else smem_limit

    def fits_dims(c: MatmulConfig) -> str | None:
        for name, block, dim in (("bm", c.bm, p.m), ("bn", c.bn, p.n), ("bk", c.bk, p.k)):
            if block > max(dim, MIN_BLOCK) and block > next_power_of_2(dim):
                return f"{name}={block} is larger than the dimension ({dim})"
        return None

    def divides(c: MatmulConfig) -> str | None:
        for name, block, dim, axis in (
            ("bm", c.bm, p.m, "M"),
            ("bn", c.bn, p.n, "N"),
            ("bk", c.bk, p.k, "K"),
        ):
            if dim % block:
                return f"{axis}={dim} is not a multiple of {name}={block} (would need padding)"
        return None

    def fits_smem(c: MatmulConfig) -> str | None:
        need = shared_memory_bytes(p, c)
        if need > limit:
            return (
                f"needs {need // 1024} KiB of shared memory ({c.num_stages} stages × "
                f"({c.bm}×{c.bk} + {c.bk}×{c.bn}) × {p.itemsize} B), more than the "
                f"{limit // 1024} KiB available"
            )
        return None

    def fits_registers(c: MatmulConfig) -> str | None:
        regs = accumulator_registers(c)
        if regs > MAX_REGISTERS_PER_THREAD:
            return (
                f"the {c.bm}×{c.bn} float32 accumulator needs {regs} registers per thread "
                f"with {c.num_warps} warps (at most {MAX_REGISTERS_PER_THREAD}): it would spill"
            )
        if regs < 8:
            return f"{c.num_warps} warps are too many for a {c.bm}×{c.bn} tile ({regs} values per thread)"
        return None

    return [fits_dims, divides, fits_smem, fits_registers]


def candidates(
    p: MatmulProblem, smem_limit: int | None = None
) -> tuple[list[MatmulConfig], list[Pruned[MatmulConfig]]]:
    """The candidate configs for `p` that can fit, and every pruned one with its reason.

    The heuristic config is always a candidate (for odd shapes that no power-of-two
    tile divides, it is the only one, and runs on padded inputs).

    Example:
      >>> import numpy as np
      >>> kept, pruned = candidates(MatmulProblem(4096, 4096, 4096, np.dtype("bfloat16")))
      >>> len(kept) > 20 and all(shared_memory_bytes(MatmulProblem(4096, 4096, 4096,
      ...     np.dtype("bfloat16")), c) <= 227 * 1024 for c in kept)
      True
      >>> any("shared memory" in x.reason for x in pruned)
      True
    """
    kept, pruned = prune(candidate_space(p), rules(p, smem_limit), what=f"matmul {p.m}x{p.k}x{p.n}")
    # The heuristic always competes, so tuning can never do worse than it.
    h = heuristic(p)
    if h not in kept:
        kept.insert(0, h)
    return kept, pruned


def interpret_candidates(p: MatmulProblem) -> list[MatmulConfig]:
    """A handful of configs for the Pallas interpreter (tests and the CPU demo): tile
    shapes only, since warps and stages mean nothing there."""
    out = [heuristic(p)]
    for bm, bn, bk in ((32, 32, 32), (64, 64, 64), (128, 64, 128)):
        cfg = MatmulConfig(bm=bm, bn=bn, bk=bk, num_warps=4, num_stages=2)
        if p.m % bm == 0 and p.n % bn == 0 and p.k % bk == 0 and cfg not in out:
            out.append(cfg)
    return out
