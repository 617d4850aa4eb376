"""The Mosaic GPU part of the matmul's candidate space on Hopper GPUs.

JAX's Hopper matmul has many knobs; most combinations either do not fit the chip or
are never the fastest. The space here is a curated handful per problem: four block
tiles (wide, tall, square, and one short enough for skinny problems), each without a
cluster and with a two-block cluster that multicasts its larger operand tile, each at
the deepest pipeline that fits shared memory and one step shallower, 16 configs in
all. Configs whose tiles do not divide the problem, that would not fit shared memory
or registers, or that this JAX's kernel cannot express are pruned with the reason.
On an H200 (jax 0.11.2) a sweep of 144 wider configs at 4096³ bf16 put two of these
first (BENCHMARKS.md).

Everything here is plain Python and numpy (no JAX), so the space is tested on CPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from kerneltune.kernels._common import Pruned, prune, shared_memory_limit, shared_memory_rule
from kerneltune.kernels.matmul import config as config_lib
from kerneltune.kernels.matmul.config import MatmulConfig, MatmulProblem

#: Block tiles (block_m, block_n) and the dimension the two compute warpgroups split them along:
#: each warpgroup accumulates 128×128 (the first two) or 64×128 (the last two).
TILES: tuple[tuple[int, int, str], ...] = (
    (128, 256, "n"),
    (256, 128, "m"),
    (128, 128, "m"),
    (64, 256, "n"),
)
#: Input dtypes the Mosaic kernel is offered for (its `wgmma` path; float32 would
#: run as TF32, and bfloat16's numpy kind is not "f").
MOSAIC_DTYPES = ("bfloat16", "float16")
#: `block_k` for 16-bit inputs: one 128-byte row, the widest shared-memory swizzle.
BK = 64
#: Deepest pipeline offered: past it, more stages only take shared memory.
MAX_STEPS = 6
#: The persistent grid's tile order: snaking strips 8 tiles wide along N.
GRID_MINOR_DIM = "n"
GRID_TILE_WIDTH = 8
#: Shared memory the kernel holds beyond its tile buffers (barriers, alignment): 112
#: bytes as lowered by jax 0.10.2; 1 KiB leaves room for other releases.
SMEM_SLACK_BYTES = 1024
#: Registers a compute warpgroup's thread may spend on its float32 accumulator: the
#: producer warpgroup gives its registers up (setmaxnreg), leaving the two compute
#: warpgroups about 232 each, some of which addressing and the epilogue need.
MAX_ACCUMULATOR_REGISTERS = 192
#: Threads in a warpgroup.
WARPGROUP_THREADS = 128
#: The TuningConfig fields the mapping fills in (see `pallas_mosaic`).
TUNING_FIELDS = frozenset(
    {
        "tile_m",
        "tile_n",
        "tile_k",
        "max_concurrent_steps",
        "epi_tile_m",
        "epi_tile_n",
        "grid_minor_dim",
        "grid_tile_width",
        "wg_dimension",
        "cluster_dimension",
    }
)


@dataclasses.dataclass(frozen=True)
class MosaicSupport:
    """Whether this JAX's Hopper Mosaic matmul can run kerneltune's configs.

    Attributes:
      reason: None when it can; else why not (e.g. the module does not import).
      fields: the fields of the module's `TuningConfig`.
    """

    reason: str | None = None
    fields: frozenset[str] = TUNING_FIELDS


def offered(p: MatmulProblem, hopper: bool) -> bool:
    """True when Mosaic configs join the space: on Hopper GPUs, for bfloat16 and
    float16 inputs."""
    return hopper and np.dtype(p.dtype).name in MOSAIC_DTYPES


def shared_memory_bytes(p: MatmulProblem, cfg: MatmulConfig) -> int:
    """Shared memory a Mosaic config needs: `max_concurrent_steps` pairs of `x` and `y`
    block tiles, the two warpgroups' output staging buffers, and a fixed slack."""
    assert cfg.max_concurrent_steps is not None
    assert cfg.epi_tile_m is not None and cfg.epi_tile_n is not None
    pipeline = (
        cfg.max_concurrent_steps
        * (cfg.block_m * cfg.block_k + cfg.block_k * cfg.block_n)
        * p.itemsize
    )
    wg_m, wg_n = cfg.warpgroup_tile
    slots = min(2, (wg_m * wg_n) // (cfg.epi_tile_m * cfg.epi_tile_n))
    epilogue = 2 * slots * cfg.epi_tile_m * cfg.epi_tile_n * p.itemsize
    return pipeline + epilogue + SMEM_SLACK_BYTES


def accumulator_registers(cfg: MatmulConfig) -> int:
    """32-bit registers per thread of a compute warpgroup for its float32 accumulator."""
    wg_m, wg_n = cfg.warpgroup_tile
    return wg_m * wg_n // WARPGROUP_THREADS


def _multicast_dimension(block_m: int, block_n: int) -> str:
    """The cluster dimension that shares the larger operand tile: side by side along M,
    two blocks need the same `block_k × block_n` tile of `y`; along N, the same `block_m × block_k` of `x`."""
    return "m" if block_n >= block_m else "n"


def _config(block_m: int, block_n: int, wg: str, cluster: str | None, steps: int) -> MatmulConfig:
    return MatmulConfig(
        backend="mosaic",
        block_m=block_m,
        block_n=block_n,
        block_k=BK,
        max_concurrent_steps=steps,
        wg_dimension=wg,  # type: ignore[arg-type]
        cluster_dimension=cluster,  # type: ignore[arg-type]
        grid_minor_dim=GRID_MINOR_DIM,  # type: ignore[arg-type]
        grid_tile_width=GRID_TILE_WIDTH,
    )


def deepest_steps(p: MatmulProblem, cfg: MatmulConfig, smem_limit: int) -> int:
    """The deepest pipeline (at most `MAX_STEPS` and the number of K steps, at least 1)
    with which `cfg`'s tiles fit `smem_limit`."""
    k_steps = max(1, -(-p.k // cfg.block_k))
    for steps in range(min(MAX_STEPS, k_steps), 1, -1):
        if shared_memory_bytes(p, dataclasses.replace(cfg, max_concurrent_steps=steps)) <= (
            smem_limit
        ):
            return steps
    return 1


def space(p: MatmulProblem, smem_limit: int | None = None) -> list[MatmulConfig]:
    """The curated Mosaic configs for `p` before pruning (see the module docstring)."""
    limit = shared_memory_limit() if smem_limit is None else smem_limit
    out = []
    for block_m, block_n, wg in TILES:
        for cluster in (None, _multicast_dimension(block_m, block_n)):
            base = _config(block_m, block_n, wg, cluster, 1)
            deepest = deepest_steps(p, base, limit)
            for steps in sorted({deepest, max(1, deepest - 1)}, reverse=True):
                out.append(dataclasses.replace(base, max_concurrent_steps=steps))
    return out


Rule = Callable[[MatmulConfig], "str | None"]


def rules(
    p: MatmulProblem, smem_limit: int | None = None, support: MosaicSupport | None = None
) -> list[Rule]:
    """The pruning rules for Mosaic configs on problem `p`: each returns None or why a
    config is out."""
    limit = shared_memory_limit() if smem_limit is None else smem_limit
    support = MosaicSupport() if support is None else support

    def supported(c: MatmulConfig) -> str | None:
        if support.reason is not None:
            return f"JAX's Mosaic GPU Hopper matmul cannot run here: {support.reason}"
        missing = sorted(TUNING_FIELDS - support.fields)
        if missing:
            return (
                f"this JAX's Mosaic Hopper matmul TuningConfig has no {missing}: a kernel "
                "kerneltune's configs do not map onto"
            )
        return None

    def dtype(c: MatmulConfig) -> str | None:
        if np.dtype(p.dtype).name not in MOSAIC_DTYPES:
            return f"the Mosaic kernel is for 16-bit inputs, not {p.dtype}"
        return None

    def divides(c: MatmulConfig) -> str | None:
        cm, cn = c.cluster_tile
        for axis, dim, tile, name, block in (
            ("M", p.m, cm, "block_m", c.block_m),
            ("N", p.n, cn, "block_n", c.block_n),
            ("K", p.k, c.block_k, "block_k", c.block_k),
        ):
            if dim % tile:
                what = f"{name}={block}"
                if tile != block:
                    what += f" × 2 blocks of a cluster along {axis.lower()}"
                return f"{axis}={dim} is not a multiple of {tile} ({what}; would need padding)"
        return None

    def steps(c: MatmulConfig) -> str | None:
        assert c.max_concurrent_steps is not None
        k_steps = -(-p.k // c.block_k)
        if c.max_concurrent_steps > k_steps:
            return (
                f"max_concurrent_steps={c.max_concurrent_steps} is more than the {k_steps} "
                f"K steps (K={p.k}, block_k={c.block_k})"
            )
        return None

    def fits_smem(c: MatmulConfig) -> str | None:
        tiles = (
            f"{c.max_concurrent_steps} steps × ({c.block_m}×{c.block_k} + {c.block_k}×{c.block_n}) × "
            f"{p.itemsize} B + output staging"
        )
        return shared_memory_rule(shared_memory_bytes(p, c), limit, tiles)

    def fits_registers(c: MatmulConfig) -> str | None:
        regs = accumulator_registers(c)
        if regs > MAX_ACCUMULATOR_REGISTERS:
            wg_m, wg_n = c.warpgroup_tile
            return (
                f"each warpgroup's {wg_m}×{wg_n} float32 accumulator needs {regs} registers "
                f"per thread (at most {MAX_ACCUMULATOR_REGISTERS}): it would spill"
            )
        return None

    return [supported, dtype, divides, steps, fits_smem, fits_registers]


def candidates(
    p: MatmulProblem,
    smem_limit: int | None = None,
    support: MosaicSupport | None = None,
    configs: Sequence[MatmulConfig] | None = None,
) -> tuple[list[MatmulConfig], list[Pruned[MatmulConfig]]]:
    """The Mosaic configs for `p` that can run, and every pruned one with its reason.

    Args:
      p: the problem.
      smem_limit: shared memory per block (default: the device's).
      support: what this JAX's Mosaic matmul can run (default: everything).
      configs: the configs to prune (default: `space(p, smem_limit)`).

    Example:
      >>> import numpy as np
      >>> kept, pruned = candidates(MatmulProblem(4096, 4096, 4096, np.dtype("bfloat16")))
      >>> len(kept), {c.backend for c in kept}
      (16, {'mosaic'})
      >>> kept, pruned = candidates(MatmulProblem(64, 8192, 8192, np.dtype("bfloat16")))
      >>> sorted({(c.block_m, c.block_n, c.cluster_dimension) for c in kept})
      [(64, 256, None)]
    """
    limit = shared_memory_limit() if smem_limit is None else smem_limit
    todo = space(p, limit) if configs is None else list(configs)
    return prune(todo, rules(p, limit, support), what=f"mosaic matmul {p.m}x{p.k}x{p.n}")


def candidates_with_mosaic(
    p: MatmulProblem, smem_limit: int | None = None, support: MosaicSupport | None = None
) -> tuple[list[MatmulConfig], list[Pruned[MatmulConfig]]]:
    """Both backends' candidates for `p` on a Hopper GPU, and every pruned config.

    Order: the heuristic (a Triton config) first, then the Mosaic configs, then the
    other Triton ones, so that a tuning whose time budget runs out has still tried
    both backends.
    """
    triton, triton_pruned = config_lib.candidates(p, smem_limit)
    mosaic, mosaic_pruned = candidates(p, smem_limit, support)
    h = config_lib.heuristic(p)
    ordered = [h, *mosaic, *(c for c in triton if c != h)]
    return ordered, [*triton_pruned, *mosaic_pruned]
