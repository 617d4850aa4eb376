"""Layer norm and RMS norm, forward and backward, our Pallas kernels lowered by
Triton, launched with the block size and warps chosen by kerneltune.

One program per row. The row's block is the row padded to a power of two; the kernel
walks it `cfg.block_size` elements at a time (masked past the row's end), first for
the statistics (float32), then to write the output. The backward computes dx the
same way, one program per row, from the forward's statistics; dweight and dbias are
sums over rows, which XLA fuses.

JAX shipped such kernels in `jax.experimental.pallas.ops.gpu.layer_norm` / `rms_norm`
until 0.12.1 removed them; these are ours, so the backend runs on every JAX kerneltune
supports.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._common import launch_params, next_power_of_2, triton_ops
from kerneltune.kernels.normalization.config import NormConfig

F32 = jnp.float32


def _chunk(ref: Any, i: Any, block: int, n: int) -> tuple[jax.Array, jax.Array]:
    """Elements `[i·block, (i+1)·block)` of the row in `ref` (`[1, width]`) in float32,
    zero past the row's end, and the mask of those inside it."""
    start = i * block
    inside = start + lax.broadcasted_iota(jnp.int32, (1, block), 1) < n
    values = triton_ops().load(ref.at[:, pl.ds(start, block)], mask=inside, other=0)
    return values.astype(F32), inside


def _store_chunk(ref: Any, i: Any, block: int, values: jax.Array, inside: jax.Array) -> None:
    triton_ops().store(ref.at[:, pl.ds(i * block, block)], values.astype(ref.dtype), mask=inside)


def _forward_row(
    x_ref, w_ref, b_ref, o_ref, mean_ref, rstd_ref, *, n: int, block: int, eps: float, centred: bool
) -> None:
    steps = pl.cdiv(n, block)
    zeros = jnp.zeros((1, block), F32)

    def add_x(i, acc):
        return acc + _chunk(x_ref, i, block, n)[0]

    mean = jnp.sum(lax.fori_loop(0, steps, add_x, zeros)) / n if centred else jnp.float32(0)

    def add_square(i, acc):
        x, inside = _chunk(x_ref, i, block, n)
        return acc + jnp.where(inside, jnp.square(x - mean), 0.0)

    rstd = lax.rsqrt(jnp.sum(lax.fori_loop(0, steps, add_square, zeros)) / n + eps)

    def write(i, carry):
        x, inside = _chunk(x_ref, i, block, n)
        y = (x - mean) * rstd * _chunk(w_ref, i, block, n)[0]
        if centred:
            y = y + _chunk(b_ref, i, block, n)[0]
        _store_chunk(o_ref, i, block, y, inside)
        return carry

    lax.fori_loop(0, steps, write, 0)
    mean_ref[...] = jnp.full((1,), mean, F32)
    rstd_ref[...] = jnp.full((1,), rstd, F32)


def _backward_row(
    x_ref, w_ref, dy_ref, mean_ref, rstd_ref, dx_ref, *, n: int, block: int, centred: bool
) -> None:
    # With x̂ = (x − mean)·rstd and g = weight·dy:
    #   dx = rstd · (g − x̂·mean(x̂·g) − mean(g))   (RMS norm: without the last term).
    steps = pl.cdiv(n, block)
    mean, rstd = mean_ref[...], rstd_ref[...]

    def terms(i):
        x, inside = _chunk(x_ref, i, block, n)
        g = _chunk(w_ref, i, block, n)[0] * _chunk(dy_ref, i, block, n)[0]
        return jnp.where(inside, (x - mean) * rstd, 0.0), g, inside

    def add(i, acc):
        x_hat, g, _ = terms(i)
        return acc[0] + x_hat * g, acc[1] + g

    zeros = jnp.zeros((1, block), F32)
    xg, gs = lax.fori_loop(0, steps, add, (zeros, zeros))
    c1 = jnp.sum(xg) / n
    c2 = jnp.sum(gs) / n if centred else jnp.float32(0)

    def write(i, carry):
        x_hat, g, inside = terms(i)
        _store_chunk(dx_ref, i, block, rstd * (g - x_hat * c1 - c2), inside)
        return carry

    lax.fori_loop(0, steps, write, 0)


def _specs(n: int, cfg: NormConfig) -> tuple[Any, Any, Any]:
    """Block specs of one program per row: a `[rows, n]` array by row (the row padded
    to a power of two, at least one step wide), a parameter (`[1, n]`) shared by all,
    a statistic (`[rows]`) by element."""
    width = max(next_power_of_2(n), cfg.block_size)
    by_row = pl.BlockSpec((1, width), lambda r: (r, 0))
    shared = pl.BlockSpec((1, width), lambda r: (0, 0))
    return by_row, shared, pl.BlockSpec((1,), lambda r: (r,))


def norm_forward(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    *,
    cfg: NormConfig,
    eps: float,
    interpret: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The norm of `x` over its last axis and its float32 statistics `(mean, rstd)`
    (each of `x.shape[:-1]`): layer norm with a `bias`, RMS norm (mean 0) without."""
    n = x.shape[-1]
    rows = x.reshape((-1, n))
    centred = bias is not None
    # RMS norm has no bias: the kernel's bias operand is the weight again, never read.
    params = [weight.reshape((1, n)), (weight if bias is None else bias).reshape((1, n))]
    by_row, shared, stat = _specs(n, cfg)
    stat_shape = jax.ShapeDtypeStruct((rows.shape[0],), F32)
    out, mean, rstd = pl.pallas_call(
        functools.partial(_forward_row, n=n, block=cfg.block_size, eps=eps, centred=centred),
        out_shape=[jax.ShapeDtypeStruct(rows.shape, x.dtype), stat_shape, stat_shape],
        grid=(rows.shape[0],),
        in_specs=[by_row, shared, shared],
        out_specs=[by_row, stat, stat],
        compiler_params=launch_params(cfg, interpret=interpret),
        interpret=interpret,
        name="kerneltune_norm_forward",
    )(rows, *params)
    batch = x.shape[:-1]
    return out.reshape(x.shape), mean.reshape(batch), rstd.reshape(batch)


def norm_backward(
    x: jax.Array,
    weight: jax.Array,
    mean: jax.Array,
    rstd: jax.Array,
    dout: jax.Array,
    *,
    centred: bool,
    cfg: NormConfig,
    interpret: bool,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """dx (one program per row), dweight and dbias (sums over rows, by XLA; no dbias
    for RMS norm) of the norm whose forward gave `mean` and `rstd`."""
    n = x.shape[-1]
    rows, dy = x.reshape((-1, n)), dout.reshape((-1, n))
    stats = mean.reshape(-1), rstd.reshape(-1)
    by_row, shared, stat = _specs(n, cfg)
    dx = pl.pallas_call(
        functools.partial(_backward_row, n=n, block=cfg.block_size, centred=centred),
        out_shape=jax.ShapeDtypeStruct(rows.shape, x.dtype),
        grid=(rows.shape[0],),
        in_specs=[by_row, shared, by_row, stat, stat],
        out_specs=by_row,
        compiler_params=launch_params(cfg, interpret=interpret),
        interpret=interpret,
        name="kerneltune_norm_backward",
    )(rows, weight.reshape((1, n)), dy, *stats)
    x_hat = (rows.astype(F32) - stats[0][:, None]) * stats[1][:, None]
    dy32 = dy.astype(F32)
    dweight = jnp.sum(dy32 * x_hat, axis=0).astype(weight.dtype)
    dbias = jnp.sum(dy32, axis=0).astype(weight.dtype) if centred else None
    return dx.reshape(x.shape), dweight, dbias


class TritonBackend(Backend):
    """Our Pallas norm kernels, forward and backward, with a tuned block size and warp
    count (the config's backend is called "pallas")."""

    name = "pallas"
    lowering = "triton"
    interprets = True

    def run(self, kernel, x, *params, cfg: NormConfig, eps: float):
        return self.fwd_with_residuals(kernel, x, *params, cfg=cfg, eps=eps)[0]

    def fwd_with_residuals(self, kernel, x, *params, cfg: NormConfig, eps: float):
        weight, bias = params if kernel.which == "layer_norm" else (params[0], None)
        out, mean, rstd = norm_forward(
            x, weight, bias, cfg=cfg, eps=eps, interpret=kernel.use_interpreter()
        )
        return out, (mean, rstd)

    def vjp(self, kernel, stats, out, dout, x, *params, cfg: NormConfig, eps: float):
        centred = kernel.which == "layer_norm"
        mean, rstd = stats
        dx, dweight, dbias = norm_backward(
            x,
            params[0],
            mean,
            rstd,
            dout.astype(x.dtype),
            centred=centred,
            cfg=cfg,
            interpret=kernel.use_interpreter(),
        )
        return (dx, dweight, dbias) if centred else (dx, dweight)
