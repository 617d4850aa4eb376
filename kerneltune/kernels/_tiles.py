"""The tiles of the bundled kernels' Triton dots (the matmul, the gated linear unit,
the loss head): the smallest tile, a block for a dimension, the checks a config's
blocks pass where it is built, and the pruning rules that hold them against a problem.

A tiling names each block field with the dimension it tiles and that axis's letter:
`(("block_m", p.m, "M"), ("block_n", p.n, "N"), ("block_k", p.k, "K"))`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kerneltune._src.params import check_positive, check_positive_power_of_two
from kerneltune.kernels._common import (
    Rule,
    next_power_of_2,
    shared_memory_limit,
    shared_memory_rule,
)

#: The smallest tile side Triton's `dot` accepts.
MIN_BLOCK = 16

Tiling = Sequence[tuple[str, int, str]]


def block_for(dim: int, preferred: int) -> int:
    """`preferred`, or the smallest power of two covering a smaller `dim` (at least
    `MIN_BLOCK`).

    Example:
      >>> block_for(4096, 128), block_for(40, 128), block_for(3, 128)
      (128, 64, 16)
    """
    return max(MIN_BLOCK, min(preferred, next_power_of_2(dim)))


def check_blocks(cfg: Any, names: Iterable[str], *, dot: str = "Triton's dot") -> None:
    """Raises ValueError unless each of `cfg`'s block fields `names` is a power of two
    of at least `MIN_BLOCK` (the smallest tile `dot` accepts)."""
    owner = type(cfg).__name__
    for name in names:
        value = getattr(cfg, name)
        check_positive_power_of_two(owner, name, value)
        if value < MIN_BLOCK:
            raise ValueError(
                f"{owner}.{name} must be at least {MIN_BLOCK} (the smallest tile "
                f"{dot} accepts), got {value}."
            )


def check_launch(cfg: Any) -> None:
    """Raises ValueError unless `cfg.num_warps` is a power of two and `cfg.num_stages`
    a positive integer (None passes: a default fills it)."""
    owner = type(cfg).__name__
    check_positive_power_of_two(owner, "num_warps", cfg.num_warps)
    check_positive(owner, "num_stages", cfg.num_stages)


def larger_than_dims(cfg: Any, tiling: Tiling) -> str | None:
    """Why `cfg` is out: the first block larger than the dimension it tiles (past the
    dimension's next power of two, and `MIN_BLOCK`); None when none is."""
    for name, dim, _ in tiling:
        block = getattr(cfg, name)
        if block > max(MIN_BLOCK, next_power_of_2(dim)):
            return f"{name}={block} is larger than the dimension ({dim})"
    return None


def not_dividing(cfg: Any, tiling: Tiling) -> str | None:
    """Why `cfg`'s tiles need padding: the first block that does not divide its
    dimension; None when every one divides."""
    for name, dim, axis in tiling:
        block = getattr(cfg, name)
        if dim % block:
            return f"{axis}={dim} is not a multiple of {name}={block} (would need padding)"
    return None


def tile_rules(tiling: Tiling) -> list[Rule[Any]]:
    """The pruning rules of a tiling: no block larger than its dimension, and (so that
    nothing is padded) every block dividing it."""

    def fits_dims(c: Any) -> str | None:
        return larger_than_dims(c, tiling)

    def divides(c: Any) -> str | None:
        return not_dividing(c, tiling)

    return [fits_dims, divides]


def staged_dot_bytes(cfg: Any, itemsize: int, weights: int = 1) -> int:
    """Shared memory a pipelined dot `x[m, k] @ w[k, n]` holds: per stage one `x` tile
    and `weights` weight tiles."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    return cfg.num_stages * (bm * bk + weights * bk * bn) * itemsize


def dot_rules(p: Any, smem_limit: int | None = None, weights: int = 1) -> list[Rule[Any]]:
    """The pruning rules of a pipelined dot `x[m, k] @ w[k, n]` (`p` has `m`, `n`, `k`
    and `itemsize`): the tiling's rules, and its stages (`staged_dot_bytes`) within
    `smem_limit` bytes of shared memory (default: the device's)."""
    limit = shared_memory_limit() if smem_limit is None else smem_limit
    tiling = (("block_m", p.m, "M"), ("block_n", p.n, "N"), ("block_k", p.k, "K"))

    def fits_smem(c: Any) -> str | None:
        w = f"{weights} × " if weights > 1 else ""
        tiles = (
            f"{c.num_stages} stages × ({c.block_m}×{c.block_k} + {w}{c.block_k}×{c.block_n})"
            f" × {p.itemsize} B"
        )
        return shared_memory_rule(staged_dot_bytes(c, p.itemsize, weights), limit, tiles)

    return [*tile_rules(tiling), fits_smem]
