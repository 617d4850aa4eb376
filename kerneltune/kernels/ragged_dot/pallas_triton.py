"""The grouped matmul written in Pallas, lowered through Triton on GPUs.

Forward and d_lhs (`grouped_matmul`): the rows of the ragged operand are cut into
tiles of `block_m` rows *per group*: a tile that straddles a group boundary is
computed once for each group it holds rows of, and each time only that group's rows
are stored (a masked store). A schedule built in JAX before the launch lists, for every
program, its group, its row tile and the group's row range; a fixed grid of
`ceil(M / block_m) + G` row tiles always covers it (each group boundary adds at most
one tile), and the surplus programs store nothing. The rows after the last group form
one more "group" whose tiles store zeros, as `jax.lax.ragged_dot` gives there. Each
program walks the contracted axis in steps of `block_k`, multiplying its rows by its
group's expert (read transposed in place for d_lhs) into a float32 accumulator.

d_rhs (`grouped_transposed_matmul`): one program per group and `block_m × block_n`
output tile walks the group's rows in steps of `block_k`, masking the rows outside the
group, and accumulates `lhs_rowsᵀ · d_out_rows`. An empty group's slice is zero.

With `group_offset` (expert parallelism) the kernels are given the local groups' sizes
and their first row, `row_start` (`groups.local_groups`): the schedule's groups begin
there, and the rows before it form one more zero "group" in front. Tiles of rows outside
the local groups only store zeros (forward, d_lhs) or are never visited (d_rhs): a call
costs what the same local groups cost at the top of the rows, the renumbered layout.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from kerneltune.kernels._common import launch_params, pad_to, pallas_dot, triton_ops
from kerneltune.kernels.ragged_dot import groups as groups_lib
from kerneltune.kernels.ragged_dot.config import RaggedDotConfig
from kerneltune.kernels.ragged_dot.pallas_backward import PallasGradient


def tile_schedule(
    group_sizes: jax.Array, m: int, block_m: int, start: jax.Array | None = None
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """For each of the `ceil(m / block_m) + G` row-tile programs (one more with
    `start`): its group (G for the rows outside the groups, which get zeros), its row
    tile, and the first row and one past the last that it stores (equal for a program
    with nothing to do). The groups begin at row `start` (0 when None); the rows before
    it are one zero segment, the rows after the last group another.

    Example:
      >>> import jax.numpy as jnp
      >>> group, tile, lo, hi = tile_schedule(jnp.array([3, 0, 6], jnp.int32), 12, 4)
      >>> group.tolist(), tile.tolist(), lo.tolist(), hi.tolist()
      ([0, 2, 2, 2, 3, 3], [0, 0, 1, 2, 2, 0], [0, 3, 3, 3, 9, 0], [3, 9, 9, 9, 12, 0])
      >>> s = tile_schedule(jnp.array([2, 3], jnp.int32), 12, 4, start=jnp.int32(5))
      >>> [a.tolist() for a in s]  # rows 0-4 zero, groups at rows 5-6 and 7-9, 10-11 zero
      [[2, 2, 0, 1, 1, 2], [0, 1, 1, 1, 2, 2], [0, 0, 5, 7, 7, 10], [5, 5, 7, 10, 10, 12]]
    """
    g = group_sizes.shape[0]
    starts_g, ends_g = groups_lib.group_bounds(group_sizes, m, start)
    zero = jnp.full((1,), g, jnp.int32)
    # Segments of rows, in order: [the rows before `start`], each group, the rows after.
    seg_starts = [starts_g, ends_g[-1:]]
    seg_ends = [ends_g, jnp.full((1,), m, jnp.int32)]
    seg_group = [jnp.arange(g, dtype=jnp.int32), zero]
    if start is not None:
        seg_starts.insert(0, jnp.zeros((1,), jnp.int32))
        seg_ends.insert(0, starts_g[:1])
        seg_group.insert(0, zero)
    starts, ends = jnp.concatenate(seg_starts), jnp.concatenate(seg_ends)
    owner = jnp.concatenate(seg_group)
    segments = starts.shape[0]
    first = starts // block_m
    count = jnp.where(ends > starts, (ends - 1) // block_m - first + 1, 0)
    offsets_end = jnp.cumsum(count)
    offsets_start = offsets_end - count
    # Each boundary between two segments adds at most one tile.
    t = jnp.arange(-(-m // block_m) + segments - 1, dtype=jnp.int32)
    seg = jnp.minimum(jnp.searchsorted(offsets_end, t, side="right"), segments - 1)
    valid = t < offsets_end[-1]
    group = jnp.where(valid, owner[seg], g)
    tile = jnp.where(valid, first[seg] + t - offsets_start[seg], 0)
    lo = jnp.where(valid, starts[seg], 0)
    hi = jnp.where(valid, ends[seg], 0)
    return (
        group.astype(jnp.int32),
        tile.astype(jnp.int32),
        lo.astype(jnp.int32),
        hi.astype(jnp.int32),
    )


def _grouped_kernel(
    group_ref, tile_ref, lo_ref, hi_ref, x_ref, w_ref, o_ref, *,
    block_m: int, block_n: int, block_k: int, steps: int, groups: int,
    transpose_w: bool, rows_first: bool, upcast: bool,
):  # fmt: skip
    t, j = (
        (pl.program_id(0), pl.program_id(1)) if rows_first else (pl.program_id(1), pl.program_id(0))
    )
    group, lo, hi = group_ref[t], lo_ref[t], hi_ref[t]
    row0 = pl.multiple_of(tile_ref[t] * block_m, block_m)
    col0 = pl.multiple_of(j * block_n, block_n)
    expert = jnp.minimum(group, groups - 1)
    # The rows after the last group (group == groups) and idle programs multiply nothing.
    # An int32 product, not `jnp.where(cond, steps, 0)`: Triton lowered that select of
    # two Python ints to a boolean loop bound, which its `scf.for` rejects.
    n_steps = ((group < groups) & (hi > lo)).astype(jnp.int32) * jnp.int32(steps)

    def step(i, acc):
        k0 = pl.multiple_of(i * block_k, block_k)
        x = x_ref[pl.ds(row0, block_m), pl.ds(k0, block_k)]
        if transpose_w:
            w = w_ref[expert, pl.ds(col0, block_n), pl.ds(k0, block_k)]
        else:
            w = w_ref[expert, pl.ds(k0, block_k), pl.ds(col0, block_n)]
        return acc + pallas_dot(x, w, upcast=upcast, trans_y=transpose_w)

    acc = lax.fori_loop(0, n_steps, step, jnp.zeros((block_m, block_n), jnp.float32))
    rows = row0 + lax.broadcasted_iota(jnp.int32, (block_m, block_n), 0)
    triton_ops().store(
        o_ref.at[pl.ds(row0, block_m), pl.ds(col0, block_n)],
        acc.astype(o_ref.dtype),
        mask=(rows >= lo) & (rows < hi),
    )


def _tiled_call(
    kernel: Callable[..., None],
    cfg: RaggedDotConfig,
    interpret: bool,
    *,
    out_shape: jax.ShapeDtypeStruct,
    grid: tuple[Any, ...],
    name: str,
    **static: Any,
) -> Callable[..., jax.Array]:
    """`kernel` as a `pallas_call` with `cfg`'s tiles, tile order and launch, and its
    other `static` arguments; the interpreter upcasts the dot's operands."""
    bm, bn, bk = cfg.blocks
    body = functools.partial(
        kernel,
        block_m=bm,
        block_n=bn,
        block_k=bk,
        rows_first=cfg.tile_order == "m",
        upcast=interpret,
        **static,
    )
    return pl.pallas_call(
        body,
        out_shape=out_shape,
        grid=grid,
        compiler_params=launch_params(cfg, interpret=interpret),
        interpret=interpret,
        name=name,
    )


def grouped_matmul(
    x: jax.Array,
    w: jax.Array,
    group_sizes: jax.Array,
    cfg: RaggedDotConfig,
    *,
    out_dtype: jnp.dtype,
    transpose_w: bool = False,
    interpret: bool = False,
    row_start: jax.Array | None = None,
) -> jax.Array:
    """`x[M, C]` times group g's expert for the rows of group g: `w[g]` (`[G, C, N]`),
    or with `transpose_w` `w[g]ᵀ` (`w` is `[G, N, C]`); the groups begin at row
    `row_start` (0 when None) and the rows outside them are zero. Output `[M, N]` in
    `out_dtype`, accumulated in float32.

    The contracted and column axes are zero-padded to the tiles where these do not
    divide them (correct, but wasted work: the candidate space avoids such tiles).
    """
    bm, bn, bk = cfg.blocks
    m, c = x.shape
    g = w.shape[0]
    n = w.shape[1] if transpose_w else w.shape[2]
    xp = pad_to(x, (bm, bk))
    wp = (
        jnp.pad(w, ((0, 0), (0, (-n) % bn), (0, (-c) % bk)))
        if transpose_w
        else jnp.pad(w, ((0, 0), (0, (-c) % bk), (0, (-n) % bn)))
    )
    mp, cp = xp.shape
    np_ = n + (-n) % bn
    schedule = tile_schedule(group_sizes, m, bm, row_start)
    tiles_m, tiles_n = schedule[0].shape[0], np_ // bn
    rows_first = cfg.tile_order == "m"
    out = _tiled_call(
        _grouped_kernel,
        cfg,
        interpret,
        out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid=(tiles_m, tiles_n) if rows_first else (tiles_n, tiles_m),
        name="kerneltune_ragged_dot",
        steps=cp // bk,
        groups=g,
        transpose_w=transpose_w,
    )(*schedule, xp, wp)
    return out if (mp, np_) == (m, n) else out[:m, :n]


def _transposed_kernel(
    lo_ref, hi_ref, a_ref, b_ref, o_ref, *,
    block_m: int, block_n: int, block_k: int, rows_first: bool, upcast: bool,
):  # fmt: skip
    g = pl.program_id(0)
    i, j = (
        (pl.program_id(1), pl.program_id(2)) if rows_first else (pl.program_id(2), pl.program_id(1))
    )
    lo, hi = lo_ref[g], hi_ref[g]
    col_a = pl.multiple_of(i * block_m, block_m)
    col_b = pl.multiple_of(j * block_n, block_n)

    def step(s, acc):
        r0 = lo + s * block_k
        keep = (r0 + lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)) < hi
        a = a_ref[pl.ds(r0, block_k), pl.ds(col_a, block_m)]
        b = b_ref[pl.ds(r0, block_k), pl.ds(col_b, block_n)]
        # Rows past the group belong to the next one (or are padding): masked out.
        a = jnp.where(keep, a, jnp.zeros_like(a))
        b = jnp.where(keep, b, jnp.zeros_like(b))
        return acc + pallas_dot(a, b, upcast=upcast, trans_x=True)

    n_steps = (hi - lo + block_k - 1) // block_k
    acc = lax.fori_loop(0, n_steps, step, jnp.zeros((block_m, block_n), jnp.float32))
    o_ref[g, pl.ds(col_a, block_m), pl.ds(col_b, block_n)] = acc.astype(o_ref.dtype)


def grouped_transposed_matmul(
    a: jax.Array,
    b: jax.Array,
    group_sizes: jax.Array,
    cfg: RaggedDotConfig,
    *,
    out_dtype: jnp.dtype,
    interpret: bool = False,
    row_start: jax.Array | None = None,
) -> jax.Array:
    """`out[g] = a[rows of g]ᵀ · b[rows of g]` for `a[M, P]`, `b[M, Q]`: `[G, P, Q]` in
    `out_dtype`, the groups beginning at row `row_start` (0 when None); an empty
    group's slice is zero, and rows outside the groups are not read. `block_m ×
    block_n` tiles `P × Q`; `block_k` rows are contracted per step."""
    bm, bn, bk = cfg.blocks
    m, p = a.shape
    q = b.shape[1]
    g = group_sizes.shape[0]
    # Rows: a step may start anywhere in a group and read `bk` rows past its end.
    ap = jnp.pad(a, ((0, bk), (0, (-p) % bm)))
    bp = jnp.pad(b, ((0, bk), (0, (-q) % bn)))
    pp, qp = ap.shape[1], bp.shape[1]
    lo, hi = groups_lib.group_bounds(group_sizes, m, row_start)
    rows_first = cfg.tile_order == "m"
    tiles = (pp // bm, qp // bn) if rows_first else (qp // bn, pp // bm)
    out = _tiled_call(
        _transposed_kernel,
        cfg,
        interpret,
        out_shape=jax.ShapeDtypeStruct((g, pp, qp), out_dtype),
        grid=(g, *tiles),
        name="kerneltune_ragged_dot_drhs",
    )(lo, hi, ap, bp)
    return out if (pp, qp) == (p, q) else out[:, :p, :q]


class TritonBackend(PallasGradient):
    """Our Pallas grouped matmul, lowered by Triton (any NVIDIA GPU; the interpreter
    runs it anywhere)."""

    name = "triton"
    lowering = "triton"
    interprets = True

    def run(
        self, kernel, a, b, group_sizes, group_offset=None, *, cfg: RaggedDotConfig,
        out_dtype: str, local_groups: int | None = None,
    ):  # fmt: skip
        interpret = kernel.use_interpreter()
        dtype = np.dtype(out_dtype)
        start = None
        if group_offset is not None:
            local = b.shape[0] if kernel.product != "drhs" else local_groups
            assert local is not None, "d_rhs with group_offset needs local_groups"
            group_sizes, start = groups_lib.local_groups(
                group_sizes, group_offset, local, a.shape[0]
            )
        if kernel.product == "drhs":
            return grouped_transposed_matmul(
                a, b, group_sizes, cfg, out_dtype=dtype, interpret=interpret, row_start=start
            )
        return grouped_matmul(
            a, b, group_sizes, cfg, out_dtype=dtype, transpose_w=kernel.product == "dlhs",
            interpret=interpret, row_start=start,
        )  # fmt: skip
