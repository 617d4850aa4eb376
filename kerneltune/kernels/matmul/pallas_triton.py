"""The tiled matmul written in Pallas, lowered through Triton on GPUs.

Each program computes one `block_m × block_n` tile of the output: it walks the shared dimension
in steps of `block_k`, multiplying a `block_m × block_k` slice of `x` by a `block_k × block_n` slice of `y` into
a float32 accumulator (Triton pipelines those loads over `num_stages` buffers), and
writes the tile once. Programs are numbered along one grid axis and mapped to tiles in
groups of `group_m` tile rows, so that programs in flight together reuse the same rows
of `x` and columns of `y` from L2.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kerneltune.kernels._common import launch_params, pad_to
from kerneltune.kernels.matmul.config import MatmulConfig, triton_params
from kerneltune.kernels.matmul.pallas_backward import PallasGradient


def _tile_kernel(x_ref, y_ref, o_ref, *, block_k: int, steps: int, upcast: bool):
    def step(i, acc):
        start = pl.multiple_of(i * block_k, block_k)
        x = x_ref[:, pl.ds(start, block_k)]
        y = y_ref[pl.ds(start, block_k), :]
        if upcast:  # the interpreter on CPUs: XLA:CPU has no bf16 x bf16 -> f32 dot.
            x, y = x.astype(jnp.float32), y.astype(jnp.float32)
        # jnp.dot, not pl.dot: the latter is deprecated in JAX 0.11 and gone in 0.12.
        return acc + jnp.dot(x, y, preferred_element_type=jnp.float32)

    acc = jnp.zeros(o_ref.shape, jnp.float32)
    acc = lax.fori_loop(0, steps, step, acc)
    o_ref[...] = acc.astype(o_ref.dtype)


def _grouped_tile(pid, tiles_m: int, tiles_n: int, group_m: int):
    """(tile row, tile column) of program `pid` when tiles are visited in groups of
    `group_m` rows, column by column inside a group."""
    per_group = group_m * tiles_n
    group = pid // per_group
    first_row = group * group_m
    rows_here = jnp.minimum(tiles_m - first_row, group_m)
    within = pid % per_group
    return first_row + within % rows_here, within // rows_here


def matmul_pallas(
    x: jax.Array, y: jax.Array, cfg: MatmulConfig, *, interpret: bool = False
) -> jax.Array:
    """`x @ y` for 2-D `x[m, k]` and `y[k, n]` of the same dtype, with `cfg`'s tiles.

    Dimensions that the tiles do not divide are zero-padded (correct for a product,
    but wasted work: the candidate space avoids such tiles).
    """
    group_m = triton_params(cfg)[2]  # (and a clear error for a Mosaic config)
    m, k = x.shape
    n = y.shape[1]
    xp = pad_to(x, (cfg.block_m, cfg.block_k))
    yp = pad_to(y, (cfg.block_k, cfg.block_n))
    mp, kp = xp.shape
    np_ = yp.shape[1]
    tiles_m, tiles_n = mp // cfg.block_m, np_ // cfg.block_n
    group_m = min(group_m, tiles_m)

    def x_map(pid):
        i, _ = _grouped_tile(pid, tiles_m, tiles_n, group_m)
        return i, 0

    def y_map(pid):
        _, j = _grouped_tile(pid, tiles_m, tiles_n, group_m)
        return 0, j

    def o_map(pid):
        return _grouped_tile(pid, tiles_m, tiles_n, group_m)

    out = pl.pallas_call(
        functools.partial(
            _tile_kernel, block_k=cfg.block_k, steps=kp // cfg.block_k, upcast=interpret
        ),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        grid=(tiles_m * tiles_n,),
        in_specs=[pl.BlockSpec((cfg.block_m, kp), x_map), pl.BlockSpec((kp, cfg.block_n), y_map)],
        out_specs=pl.BlockSpec((cfg.block_m, cfg.block_n), o_map),
        compiler_params=launch_params(cfg, interpret=interpret),
        interpret=interpret,
        name="kerneltune_matmul",
    )(xp, yp)
    return out if (mp, np_) == (m, n) else out[:m, :n]


class TritonBackend(PallasGradient):
    """Our Pallas tiled matmul, lowered by Triton (the interpreter runs it anywhere)."""

    name = "triton"
    lowering = "triton"
    interprets = True

    def run(self, kernel, x, y, *, cfg: MatmulConfig):
        return matmul_pallas(x, y, cfg, interpret=kernel.use_interpreter())
