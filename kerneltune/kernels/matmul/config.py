"""The matmul's config, its heuristic, and its candidate space pruned by what fits."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np

from kerneltune._src.params import check_one_of, check_positive, check_positive_power_of_two
from kerneltune.kernels._common import (
    MAX_REGISTERS_PER_THREAD,
    Pruned,
    WithItemsize,
    prune,
    shared_memory_limit,
)
from kerneltune.kernels._config import OLD_BLOCK_NAMES, BackendConfig
from kerneltune.kernels._tiles import MIN_BLOCK as MIN_BLOCK
from kerneltune.kernels._tiles import (
    block_for,
    check_blocks,
    check_launch,
    dot_rules,
    staged_dot_bytes,
)

#: The matmul's GPU backends: our Pallas kernel lowered through Triton, and JAX's
#: Mosaic GPU matmul for Hopper (`jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu`).
#: "xla" is `jnp.dot` (cuBLAS on GPUs), whose tiles XLA picks: the block fields unused.
BACKENDS = ("triton", "mosaic", "xla")
#: The two output dimensions a Mosaic config splits or orders along.
DIMS = ("m", "n")
#: Rows one warpgroup's `wgmma` works on at a time: a Mosaic warpgroup tile's height
#: must be a multiple of it.
WGMMA_ROWS = 64

Backend = Literal["triton", "mosaic", "xla"]
Dim = Literal["m", "n"]

# Fields each backend reads, with what None becomes for it. A config of one backend
# leaves the other's fields None, so that two configs that run the same kernel are
# equal (and hash, serialise and search as one).
_TRITON_DEFAULTS: dict[str, Any] = {"num_warps": 4, "num_stages": 3, "group_m": 8}
_MOSAIC_DEFAULTS: dict[str, Any] = {
    "max_concurrent_steps": 4,
    "wg_dimension": "n",
    "cluster_dimension": None,
    "grid_minor_dim": "n",
    "grid_tile_width": 1,
    "epi_tile_m": 64,
    "epi_tile_n": 64,
}


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class MatmulConfig(BackendConfig):
    """Launch parameters of the matmul on a GPU, for one of two backends.

    `backend="triton"` (the default) is our Pallas kernel lowered through Triton;
    `backend="mosaic"` is JAX's Mosaic GPU matmul for Hopper GPUs (TMA copies, `wgmma`,
    two compute warpgroups fed by a producer warpgroup, a persistent grid). Each
    backend's fields are None for the other one; None in a field of the chosen
    backend means its default.

    Attributes:
      backend: "triton" or "mosaic".
      block_m, block_n: the output tile one program (Triton) or one thread block (Mosaic)
        computes: rows, columns.
      block_k: how many columns of `x` (rows of `y`) one step of the inner loop multiplies.
      num_warps: (Triton) warps per program; default 4.
      num_stages: (Triton) software-pipelining depth of the inner loop; default 3.
      group_m: (Triton) output tiles are visited in groups of this many tile rows, so
        that programs running at the same time share rows of `x` and columns of `y`
        in L2; 1 visits tiles row by row. Default 8.
      max_concurrent_steps: (Mosaic) pipeline depth: `block_k`-steps whose `x` and `y`
        tiles are in flight in shared memory at once; default 4.
      wg_dimension: (Mosaic) "m" or "n": the block's tile is split in two along this
        dimension, one half per compute warpgroup; default "n".
      cluster_dimension: (Mosaic) None, or "m"/"n": two thread blocks adjacent along
        this dimension form a cluster and share (multicast) the operand tile they
        both need ("m": the `y` tile, "n": the `x` tile). Default None.
      grid_minor_dim, grid_tile_width: (Mosaic) the order the persistent grid visits
        output tiles in: strips `grid_tile_width` tiles wide along `grid_minor_dim`,
        snaking, for L2 reuse. Defaults "n" and 1.
      epi_tile_m, epi_tile_n: (Mosaic) the output is stored through shared memory in
        pieces of this shape; default 64×64.

    Example:
      >>> MatmulConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3)
      MatmulConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3, group_m=8)
      >>> MatmulConfig(backend="mosaic", block_m=128, block_n=256, block_k=64, cluster_dimension="m")
      MatmulConfig(backend='mosaic', block_m=128, block_n=256, block_k=64, max_concurrent_steps=4, \
wg_dimension='n', cluster_dimension='m', grid_minor_dim='n', grid_tile_width=1, \
epi_tile_m=64, epi_tile_n=64)
      >>> MatmulConfig(block_m=96)
      Traceback (most recent call last):
      ...
      ValueError: MatmulConfig.block_m must be a positive power of two, got 96.
      >>> MatmulConfig(num_warps=8, max_concurrent_steps=4)
      Traceback (most recent call last):
      ...
      ValueError: MatmulConfig.max_concurrent_steps is a field of backend='mosaic'; \
leave it None with backend='triton' (got 4).
    """

    backend: Backend = "triton"
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    # Triton
    num_warps: int | None = None
    num_stages: int | None = None
    group_m: int | None = None
    # Mosaic GPU
    max_concurrent_steps: int | None = None
    wg_dimension: Dim | None = None
    cluster_dimension: Dim | None = None
    grid_minor_dim: Dim | None = None
    grid_tile_width: int | None = None
    epi_tile_m: int | None = None
    epi_tile_n: int | None = None

    shared_fields: ClassVar[tuple[str, ...]] = ("block_m", "block_n", "block_k")
    renamed_fields: ClassVar[Mapping[str, str]] = OLD_BLOCK_NAMES
    backend_fields: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "triton": _TRITON_DEFAULTS,
        "mosaic": _MOSAIC_DEFAULTS,
        "xla": {},
    }

    def check(self) -> None:
        check_blocks(self, ("block_m", "block_n", "block_k"))
        if self.backend == "triton":
            check_launch(self)
            check_positive_power_of_two("MatmulConfig", "group_m", self.group_m)
        elif self.backend == "mosaic":
            self._check_mosaic()

    def _check_mosaic(self) -> None:
        check_positive("MatmulConfig", "max_concurrent_steps", self.max_concurrent_steps)
        check_positive("MatmulConfig", "grid_tile_width", self.grid_tile_width)
        check_one_of("MatmulConfig", "wg_dimension", self.wg_dimension, DIMS)
        check_one_of("MatmulConfig", "grid_minor_dim", self.grid_minor_dim, DIMS)
        if self.cluster_dimension not in (None, *DIMS):
            raise ValueError(
                f"MatmulConfig.cluster_dimension must be None or one of {DIMS}, got "
                f"{self.cluster_dimension!r}."
            )
        wg_m, wg_n = self.warpgroup_tile
        if wg_m % WGMMA_ROWS:
            raise ValueError(
                f"MatmulConfig(backend='mosaic'): each compute warpgroup gets a {wg_m}×{wg_n} "
                f"tile (block_m={self.block_m}, block_n={self.block_n} split along {self.wg_dimension!r}); its "
                f"height must be a multiple of {WGMMA_ROWS} (wgmma's rows)."
            )
        for name, value, side, full in (
            ("epi_tile_m", self.epi_tile_m, "height", wg_m),
            ("epi_tile_n", self.epi_tile_n, "width", wg_n),
        ):
            check_positive_power_of_two("MatmulConfig", name, value)
            assert value is not None
            if value > full:
                raise ValueError(
                    f"MatmulConfig.{name}={value} is larger than the warpgroup tile's "
                    f"{side} ({full}: block_m={self.block_m}, block_n={self.block_n} split along "
                    f"{self.wg_dimension!r}); it must divide it."
                )

    @property
    def warpgroup_tile(self) -> tuple[int, int]:
        """(Mosaic) the output tile each of the two compute warpgroups accumulates."""
        if self.wg_dimension == "m":
            return self.block_m // 2, self.block_n
        return self.block_m, self.block_n // 2

    @property
    def cluster_size(self) -> int:
        """(Mosaic) thread blocks per cluster: 2 with a cluster dimension, else 1."""
        return 1 if self.cluster_dimension is None else 2

    @property
    def cluster_tile(self) -> tuple[int, int]:
        """The output tile one cluster covers (the block's tile for Triton): the
        multiples of it that the problem's M and N must be to need no padding."""
        return (
            self.block_m * (2 if self.cluster_dimension == "m" else 1),
            self.block_n * (2 if self.cluster_dimension == "n" else 1),
        )


@dataclasses.dataclass(frozen=True)
class MatmulProblem(WithItemsize):
    """What the config depends on: `x[m, k] @ y[k, n]` in `dtype`."""

    m: int
    n: int
    k: int
    dtype: np.dtype


def triton_params(cfg: MatmulConfig) -> tuple[int, int, int]:
    """`(num_warps, num_stages, group_m)` of a Triton config.

    Raises:
      ValueError: `cfg` is a Mosaic config.
    """
    if cfg.num_warps is None or cfg.num_stages is None or cfg.group_m is None:
        raise ValueError(f"expected a backend='triton' MatmulConfig, got {cfg!r}.")
    return cfg.num_warps, cfg.num_stages, cfg.group_m


def shared_memory_bytes(p: MatmulProblem, cfg: MatmulConfig) -> int:
    """Shared memory the pipelined inner loop holds: one `x` tile and one `y` tile per
    stage. (Triton reuses those buffers for the epilogue.)"""
    triton_params(cfg)  # raises for a Mosaic config
    return staged_dot_bytes(cfg, p.itemsize)


def accumulator_registers(cfg: MatmulConfig) -> int:
    """32-bit registers per thread that the float32 accumulator tile alone needs."""
    return cfg.block_m * cfg.block_n // (32 * triton_params(cfg)[0])


def heuristic(p: MatmulProblem) -> MatmulConfig:
    """A config that fits and is reasonable for any shape: 128×128 tiles (256 wide
    for large bf16 problems, where they pay off), block_k=64 for 16-bit inputs and 32 for
    32-bit ones, 3 stages (fewer if they would not fit)."""
    wide = p.itemsize <= 2 and p.m >= 2048 and p.n >= 2048
    block_m = block_for(p.m, 128)
    block_n = block_for(p.n, 256 if wide else 128)
    block_k = block_for(p.k, 64 if p.itemsize <= 2 else 32)
    num_warps = 8 if block_m * block_n >= 128 * 256 else 4
    stages = 3
    cfg = MatmulConfig(
        block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=stages
    )
    while stages > 1 and shared_memory_bytes(p, cfg) > shared_memory_limit():
        stages -= 1
        cfg = dataclasses.replace(cfg, num_stages=stages)
    return cfg


def candidate_space(p: MatmulProblem) -> list[MatmulConfig]:
    """Every config considered before pruning. Small tiles are only offered for
    small dimensions, where large ones would mostly compute padding."""
    bms = [b for b in (16, 32, 64, 128, 256) if b >= 64 or p.m <= 256]
    bns = [b for b in (32, 64, 128, 256) if b >= 64 or p.n <= 256]
    bks = (32, 64, 128)
    return [
        MatmulConfig(block_m=block_m, block_n=block_n, block_k=block_k, num_warps=w, num_stages=s)
        for block_m, block_n, block_k, w, s in itertools.product(bms, bns, bks, (4, 8), (2, 3, 4))
    ]


def rules(p: MatmulProblem, smem_limit: int | None = None):
    """The pruning rules for problem `p`: each returns None or why a config is out."""

    def fits_registers(c: MatmulConfig) -> str | None:
        regs = accumulator_registers(c)
        if regs > MAX_REGISTERS_PER_THREAD:
            return (
                f"the {c.block_m}×{c.block_n} float32 accumulator needs {regs} registers per thread "
                f"with {c.num_warps} warps (at most {MAX_REGISTERS_PER_THREAD}): it would spill"
            )
        if regs < 8:
            return f"{c.num_warps} warps are too many for a {c.block_m}×{c.block_n} tile ({regs} values per thread)"
        return None

    return [*dot_rules(p, smem_limit), fits_registers]


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
    for block_m, block_n, block_k in ((32, 32, 32), (64, 64, 64), (128, 64, 128)):
        cfg = MatmulConfig(
            block_m=block_m, block_n=block_n, block_k=block_k, num_warps=4, num_stages=2
        )
        if p.m % block_m == 0 and p.n % block_n == 0 and p.k % block_k == 0 and cfg not in out:
            out.append(cfg)
    return out
