"""The grouped matmul's config, its heuristics, and its candidate spaces pruned by
what fits.

One config type serves the three products (the forward, d_lhs and d_rhs); each is a
kernel of its own with its own key, so each gets its own config. Their problems:

- `"fwd"`: `out[M, N] = lhs[M, K] · rhs[g]` for the rows of group g
  (`jax.lax.ragged_dot`);
- `"dlhs"`: `d_lhs[M, K] = d_out[M, N] · rhs[g]ᵀ` (the same grouped product against the
  transposed experts, read in place);
- `"drhs"`: `d_rhs[g] = lhs[rows of g]ᵀ · d_out[rows of g]`, `[G, K, N]` (the group
  axis is the contracted one).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from kerneltune._src.core.configs import config_to_dict
from kerneltune._src.params import check_one_of, check_positive
from kerneltune.kernels._common import (
    MAX_REGISTERS_PER_THREAD,
    Pruned,
    next_power_of_2,
    prune,
    shared_memory_limit,
    shared_memory_rule,
)
from kerneltune.kernels._config import BackendConfig
from kerneltune.kernels._tiles import MIN_BLOCK, block_for, check_blocks, check_launch

Backend = Literal["triton", "mosaic", "xla", "tokamax"]
TileOrder = Literal["m", "n"]
Product = Literal["fwd", "dlhs", "drhs"]

#: "xla" is `jax.lax.ragged_dot` (plain JAX); "triton" our Pallas grouped GEMM;
#: "mosaic" JAX's Mosaic GPU kernels for Hopper (`ragged_dot_mgpu`,
#: `transposed_ragged_dot_mgpu`); "tokamax" `tokamax.ragged_dot` where installed.
BACKENDS = ("triton", "mosaic", "xla", "tokamax")
#: The smallest tile side Triton's `dot` accepts.
#: The two orders the Triton kernel's programs visit output tiles in.
TILE_ORDERS: tuple[TileOrder, ...] = ("m", "n")
#: Input dtypes the Mosaic kernels take (their `wgmma` path).
MOSAIC_DTYPES = ("bfloat16", "float16")
#: The Mosaic kernels copy the ragged operand in tiles of this many rows.
MOSAIC_ROW_TILING = 8


_BLOCKS = ("block_m", "block_n", "block_k")
_BLOCK_DEFAULTS: dict[str, Any] = {"block_m": 128, "block_n": 128, "block_k": 64}


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class RaggedDotConfig(BackendConfig):
    """Launch parameters of one grouped-matmul product, for one of four backends.

    For the forward and d_lhs products, `block_m × block_n` is the output tile one
    program (thread block) computes, walking the contracted axis in steps of
    `block_k`. For d_rhs (`[G, K, N]`), `block_m × block_n` tiles one group's `K × N`
    output and `block_k` rows of the group are contracted per step (the names of
    JAX's `transposed_ragged_dot_mgpu`).

    Attributes:
      backend: "triton" (default), "mosaic", "xla" or "tokamax". The library backends
        ("xla", "tokamax") take no other field.
      block_m, block_n, block_k: tile sides (powers of two, at least 16).
      num_warps: (Triton) warps per program; default 4.
      num_stages: (Triton) software-pipelining depth of the inner loop; default 3.
      tile_order: (Triton) how programs map onto (tile of rows in a group, tile of
        columns): "m" walks down the row tiles of the groups for one column tile
        (programs in flight together read the same expert columns from L2), "n"
        walks across the columns for one row tile (they share the rows). Default "m".
      max_concurrent_steps: (Mosaic) pipeline depth in `block_k` steps; default 4.
      grid_block_n: (Mosaic) the persistent grid snakes over output tiles in strips
        this many column tiles wide; default 1.

    Example:
      >>> RaggedDotConfig(block_m=64, block_n=64, block_k=32)
      RaggedDotConfig(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=3, \
tile_order='m')
      >>> RaggedDotConfig(backend="mosaic", grid_block_n=4)
      RaggedDotConfig(backend='mosaic', block_m=128, block_n=128, block_k=64, \
max_concurrent_steps=4, grid_block_n=4)
      >>> RaggedDotConfig(backend="xla")
      RaggedDotConfig(backend='xla')
      >>> RaggedDotConfig(block_m=96)
      Traceback (most recent call last):
      ...
      ValueError: RaggedDotConfig.block_m must be a positive power of two, got 96.
    """

    backend: Backend = "triton"
    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    # Triton
    num_warps: int | None = None
    num_stages: int | None = None
    tile_order: TileOrder | None = None
    # Mosaic GPU
    max_concurrent_steps: int | None = None
    grid_block_n: int | None = None

    backend_fields: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "triton": {**_BLOCK_DEFAULTS, "num_warps": 4, "num_stages": 3, "tile_order": "m"},
        "mosaic": {**_BLOCK_DEFAULTS, "max_concurrent_steps": 4, "grid_block_n": 1},
        "xla": {},
        "tokamax": {},
    }

    def check(self) -> None:
        owner = "RaggedDotConfig"
        if self.backend in ("xla", "tokamax"):
            return
        check_blocks(self, _BLOCKS, dot="a GPU dot")
        if self.backend == "triton":
            check_launch(self)
            check_one_of(owner, "tile_order", self.tile_order, TILE_ORDERS)
        else:
            check_positive(owner, "max_concurrent_steps", self.max_concurrent_steps)
            check_positive(owner, "grid_block_n", self.grid_block_n)

    @property
    def blocks(self) -> tuple[int, int, int]:
        """`(block_m, block_n, block_k)` of a Triton or Mosaic config."""
        if self.block_m is None or self.block_n is None or self.block_k is None:
            raise ValueError(f"a backend={self.backend!r} config has no tiles: {self!r}.")
        return self.block_m, self.block_n, self.block_k


#: The library backends' configs.
XLA = RaggedDotConfig(backend="xla")
TOKAMAX = RaggedDotConfig(backend="tokamax")


@dataclasses.dataclass(frozen=True)
class RaggedDotProblem:
    """What a config depends on: the product, its sizes and dtypes (never the group
    sizes, which are data).

    Attributes:
      product: "fwd", "dlhs" or "drhs".
      m: rows of the ragged operand (tokens routed).
      k, n: the experts' input and output sizes (`rhs` is `[g, k, n]`).
      g: the number of groups (experts).
      dtype: the inputs' dtype.
      out_dtype: the output's dtype.
      local_g: with a `group_offset` (expert parallelism), the groups the call computes
        (`G_local`, the experts `rhs` holds; `g` is then all the groups); else None.
    """

    product: Product
    m: int
    k: int
    n: int
    g: int
    dtype: np.dtype
    out_dtype: np.dtype
    local_g: int | None = None

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def out_dims(self) -> tuple[int, int]:
        """The (rows, columns) one group's or the whole output is tiled over."""
        if self.product == "fwd":
            return self.m, self.n
        if self.product == "dlhs":
            return self.m, self.k
        return self.k, self.n

    @property
    def contracted(self) -> int:
        """The length of the contracted axis."""
        return {"fwd": self.k, "dlhs": self.n, "drhs": self.m}[self.product]


def shared_memory_bytes(p: RaggedDotProblem, cfg: RaggedDotConfig) -> int:
    """Shared memory one program holds: its pipelined operand tiles (one per stage or
    concurrent step) and, for Mosaic, the output tile staged for the TMA store."""
    bm, bn, bk = cfg.blocks
    if cfg.backend == "triton":
        assert cfg.num_stages is not None
        return cfg.num_stages * (bm * bk + bk * bn) * p.itemsize
    assert cfg.max_concurrent_steps is not None
    tiles = cfg.max_concurrent_steps * (bm * bk + bk * bn) * p.itemsize
    return tiles + bm * bn * np.dtype(p.out_dtype).itemsize


#: The Mosaic grid's strip width the heuristic takes where the output is that wide.
#: Measured with 128x128 tiles (CUPTI, an H100, 2026-11-28, BENCHMARKS.md): 4 was the
#: fastest or within 7% of it for all three products at 8 MoE shapes (8-256 experts,
#: 512-14336 wide), while 1 and 2, which an earlier rule took for outputs under 32 or
#: 8 tiles wide, were up to 45% and 17% slower.
GRID_BLOCK_N = 4
#: The strip widths the Mosaic search space offers.
GRID_WIDTHS = (1, 2, 4)


def grid_block_n_rule(p: RaggedDotProblem, block_n: int) -> int:
    """The heuristic's Mosaic grid strip width: `GRID_BLOCK_N`, or the widest strip of
    the search space's (1, 2, 4) that the output's column tiles fill."""
    tiles_n = -(-p.out_dims[1] // block_n)
    return max(w for w in GRID_WIDTHS if w <= max(1, min(GRID_BLOCK_N, tiles_n)))


def triton_heuristic(p: RaggedDotProblem) -> RaggedDotConfig:
    """A Triton config that fits any shape: 128×128 tiles (smaller for small
    dimensions), `block_k` 64 for 16-bit inputs and 32 for 32-bit ones, 3 stages (fewer
    where they would not fit)."""
    rows, cols = p.out_dims
    # Groups split row tiles: with few rows per group, shorter tiles waste less.
    per_group = max(1, rows // max(p.g, 1)) if p.product != "drhs" else rows
    bm = block_for(per_group if p.product != "drhs" else rows, 128)
    bn = block_for(cols, 128)
    bk = block_for(p.contracted, 64 if p.itemsize <= 2 else 32)
    stages = 3
    cfg = RaggedDotConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=4, num_stages=stages)
    while stages > 1 and shared_memory_bytes(p, cfg) > shared_memory_limit():
        stages -= 1
        cfg = dataclasses.replace(cfg, num_stages=stages)
    return cfg


#: Routed rows per expert at or under which the forward's Mosaic heuristic takes 64x256
#: tiles instead of 128x128: with few rows a group, a 128-row tile is mostly the
#: group's partial last tile. Chosen on the H200 table's 34 grouped-matmul keys (CUPTI,
#: every candidate timed, 2026-11-28, BENCHMARKS.md): there 64x256 was Mosaic's fastest
#: or within 1% of it at every key of 128 rows an expert or fewer and at 3 of 5 of 256,
#: and 6-28% slower than 128x128 at every key of 512 or more. The heuristic's regret
#: against the best of all backends went from 7.8% to 4.8% in median there (41.6% at
#: worst: Triton's tiles lead at some shapes). The gradients' products keep 128x128:
#: no table key measured them with few rows an expert.
SHORT_GROUP_ROWS = 256


def mosaic_heuristic(p: RaggedDotProblem, *, short_tiles: bool = True) -> RaggedDotConfig:
    """128×128×64 at 4 steps (the best measured at both benchmark shapes on an H100,
    for all three products), or (`short_tiles`) 64×256×64 for a forward product with
    `SHORT_GROUP_ROWS` rows an expert or fewer; `grid_block_n_rule`'s strip width."""
    short = short_tiles and p.product == "fwd" and p.m <= SHORT_GROUP_ROWS * max(p.g, 1)
    bm, bn = (64, 256) if short and p.n % 256 == 0 else (128, 128)
    return RaggedDotConfig(
        backend="mosaic",
        block_m=bm,
        block_n=bn,
        block_k=64,
        max_concurrent_steps=4,
        grid_block_n=grid_block_n_rule(p, bn),
    )


def mosaic_space(p: RaggedDotProblem) -> list[RaggedDotConfig]:
    """The Mosaic configs considered before pruning: block_m {64, 128} × block_n {64,
    128, 256} × block_k 64 × steps {2, 4} × grid_block_n {1, 2, 4}."""
    return [
        RaggedDotConfig(
            backend="mosaic",
            block_m=bm,
            block_n=bn,
            block_k=64,
            max_concurrent_steps=steps,
            grid_block_n=width,
        )
        for bm, bn, steps, width in itertools.product(
            (64, 128), (64, 128, 256), (2, 4), GRID_WIDTHS
        )
    ]


#: Triton tiles offered on GPUs: (block_m, block_n, block_k, warps, stages).
TRITON_TILES = (
    (64, 64, 64, 4, 4),
    (64, 128, 64, 4, 3),
    (128, 64, 64, 4, 3),
    (128, 128, 64, 8, 3),
    (128, 128, 32, 4, 4),
    (128, 256, 64, 8, 3),
)


def triton_space(p: RaggedDotProblem) -> list[RaggedDotConfig]:
    """The Triton configs considered before pruning: a few tiles, each in both tile
    orders, plus the heuristic."""
    out = [triton_heuristic(p)]
    for (bm, bn, bk, warps, stages), order in itertools.product(TRITON_TILES, TILE_ORDERS):
        out.append(
            RaggedDotConfig(
                block_m=bm,
                block_n=bn,
                block_k=bk,
                num_warps=warps,
                num_stages=stages,
                tile_order=order,
            )
        )
    return out


def mosaic_unsupported(p: RaggedDotProblem) -> str | None:
    """Why no Mosaic config can run the problem (its dtype), or None."""
    if np.dtype(p.dtype).name not in MOSAIC_DTYPES:
        return f"the Mosaic kernels take float16 or bfloat16 inputs, not {np.dtype(p.dtype)}"
    if np.dtype(p.out_dtype) != np.dtype(p.dtype):
        return (
            f"the Mosaic kernels write the inputs' dtype ({np.dtype(p.dtype)}); the call "
            f"wants {np.dtype(p.out_dtype)}"
        )
    return None


def rules(p: RaggedDotProblem, smem_limit: int | None = None):
    """The pruning rules for problem `p`: each returns None or why a config is out."""
    limit = shared_memory_limit() if smem_limit is None else smem_limit
    rows, cols = p.out_dims

    def fits_dims(c: RaggedDotConfig) -> str | None:
        if c.backend in ("xla", "tokamax"):
            return None
        bm, bn, bk = c.blocks
        for name, block, dim in (
            ("block_m", bm, rows),
            ("block_n", bn, cols),
            ("block_k", bk, p.contracted),
        ):
            if block > max(next_power_of_2(dim), MIN_BLOCK):
                return f"{name}={block} is larger than the dimension it tiles ({dim})"
        return None

    def mosaic_divides(c: RaggedDotConfig) -> str | None:
        if c.backend != "mosaic":
            return None
        reason = mosaic_unsupported(p)
        if reason is not None:
            return reason
        bm, bn, bk = c.blocks
        # What JAX's kernels require (they raise otherwise) or would store out of bounds.
        checks: tuple[tuple[str, int, str, int], ...]
        if p.product == "drhs":
            checks = (
                ("K", p.k, "block_m", bm),
                ("N", p.n, "block_n", bn),
                ("M", p.m, "block_k", bk),
            )
        else:
            # The ragged operand's rows are copied in tiles of 8 rows (TMA): JAX's kernel
            # raises "dimension 0 must have size smaller or a multiple of its tiling 8".
            checks = (
                ("columns", cols, "block_n", bn),
                ("contracted", p.contracted, "block_k", bk),
                ("M", p.m, "its row tiling", MOSAIC_ROW_TILING),
            )
        for axis, dim, name, block in checks:
            if dim % block:
                return f"the Mosaic kernel needs {axis}={dim} to be a multiple of {name}={block}"
        return None

    def fits_smem(c: RaggedDotConfig) -> str | None:
        if c.backend in ("xla", "tokamax"):
            return None
        bm, bn, bk = c.blocks
        depth = c.num_stages if c.backend == "triton" else c.max_concurrent_steps
        tiles = f"{depth} × ({bm}×{bk} + {bk}×{bn}) × {p.itemsize} B"
        return shared_memory_rule(shared_memory_bytes(p, c), limit, tiles)

    def fits_registers(c: RaggedDotConfig) -> str | None:
        if c.backend != "triton":
            return None
        bm, bn, _ = c.blocks
        assert c.num_warps is not None
        regs = bm * bn // (32 * c.num_warps)
        if regs > MAX_REGISTERS_PER_THREAD:
            return (
                f"the {bm}×{bn} float32 accumulator needs {regs} registers per thread "
                f"with {c.num_warps} warps (at most {MAX_REGISTERS_PER_THREAD})"
            )
        return None

    return [fits_dims, mosaic_divides, fits_smem, fits_registers]


def candidates(
    p: RaggedDotProblem,
    *,
    mosaic: str | None,
    tokamax: str | None,
    smem_limit: int | None = None,
) -> tuple[list[RaggedDotConfig], list[Pruned[RaggedDotConfig]]]:
    """The GPU candidates for `p` that can run, and every pruned one with its reason.

    Args:
      p: the problem.
      mosaic: None where JAX's Mosaic kernels can run here (a Hopper GPU, a JAX whose
        kernels have the expected parameters), else why not: every Mosaic config is
        then pruned with it.
      tokamax: the same for tokamax (offered for the forward only: it brings its own
        backward).
      smem_limit: shared memory per block (default: the device's).

    Example:
      >>> import numpy as np
      >>> bf16 = np.dtype("bfloat16")
      >>> p = RaggedDotProblem("fwd", 32768, 2048, 1408, 64, bf16, bf16)
      >>> kept, pruned = candidates(p, mosaic=None, tokamax="not installed")
      >>> mosaic_heuristic(p) in kept and XLA in kept
      True
      >>> any(x.reason == "not installed" for x in pruned)
      True
    """
    space: list[RaggedDotConfig] = [XLA]
    if p.product == "fwd":
        space.append(TOKAMAX)
    space += triton_space(p)
    space += mosaic_space(p)
    rule_list = rules(p, smem_limit)

    def available(c: RaggedDotConfig) -> str | None:
        if c.backend == "mosaic":
            return mosaic
        if c.backend == "tokamax":
            return tokamax
        return None

    kept, pruned = prune(space, [available, *rule_list], what=f"ragged_dot {p}")
    h = triton_heuristic(p)
    if h not in kept:  # the Triton heuristic always competes (it pads what it must)
        kept.insert(1, h)
    return kept, pruned


def interpret_candidates(p: RaggedDotProblem) -> list[RaggedDotConfig]:
    """A handful of small Triton configs for the Pallas interpreter (tests and the CPU
    demo): tile shapes and both tile orders; warps and stages mean nothing there."""
    out = [triton_heuristic(p)]
    small: tuple[tuple[int, int, int, TileOrder], ...] = ((16, 16, 16, "m"), (32, 32, 16, "n"))
    for bm, bn, bk, order in small:
        cfg = RaggedDotConfig(
            block_m=bm, block_n=bn, block_k=bk, num_warps=4, num_stages=2, tile_order=order
        )
        if cfg not in out:
            out.append(cfg)
    return out


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


def across_sizes(product: Product, cfg: Any, sizes: Sequence[int]) -> dict[str, Any]:
    """`cfg`'s fields (of a call of `sizes`, `CallShape.sizes`) as they compare across
    sizes: the Triton `tile_order` as "longer" or "shorter", the output axis its
    programs walk down first (rows for "m", columns for "n"), which names the same
    schedule whichever of rows and columns is longer. The forward's output is `[M, N]`,
    d_lhs's `[M, K]`; d_rhs keeps its order as it is. Leave-one-out over the H200 table
    (BENCHMARKS.md, 2026-12-07), the one key whose output has more columns than rows
    (16384 rows × 32768 columns over 8 experts) went from 21.9% behind the best to 0.0%,
    its neighbours' "n" (along the shorter, columns there) matched to its "m"."""
    fields = config_to_dict(cfg)
    order = fields.get("tile_order")
    found = dims(product, sizes)
    if order not in ("m", "n") or product == "drhs" or found is None:
        return fields
    rows, cols = sizes[0], found[0]  # the output is [M, N] (forward) or [M, K] (d_lhs)
    fields["tile_order"] = "longer" if (order == "m") == (rows >= cols) else "shorter"
    return fields
