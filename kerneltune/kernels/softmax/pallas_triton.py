"""Softmax over the last axis, our Pallas kernel lowered by Triton: one program per
row, the whole row (padded to a power of two) loaded at once, with the warp count
chosen by kerneltune.

JAX shipped such a kernel in `jax.experimental.pallas.ops.gpu.softmax` until 0.12.1
removed it; this one is ours, so the backend runs on every JAX kerneltune supports.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kerneltune.kernels._common import launch_params, next_power_of_2, triton_ops
from kerneltune.kernels.softmax.config import SoftmaxConfig
from kerneltune.kernels.softmax.reference import SoftmaxGradient


def _softmax_row(x_ref, o_ref, *, n: int, width: int) -> None:
    plt = triton_ops()
    # The block is the row padded to a power of two. Triton does not mask what lies
    # past the row's end: loaded, it is the next row; stored, it would overwrite the
    # next row. Both the load and the store are masked to the row.
    inside = lax.broadcasted_iota(jnp.int32, (1, width), 1) < n
    row = plt.load(x_ref, mask=inside, other=-jnp.inf).astype(jnp.float32)
    e = jnp.exp(row - jnp.max(row, axis=1, keepdims=True))
    plt.store(o_ref, (e / jnp.sum(e, axis=1, keepdims=True)).astype(o_ref.dtype), mask=inside)


def softmax_pallas(x: jax.Array, *, cfg: SoftmaxConfig, interpret: bool) -> jax.Array:
    """Softmax over the last axis of `x` with `cfg.num_warps` warps per row."""
    n = x.shape[-1]
    rows = x.reshape((-1, n))
    width = next_power_of_2(n)
    block = pl.BlockSpec((1, width), lambda i: (i, 0))
    out = pl.pallas_call(
        functools.partial(_softmax_row, n=n, width=width),
        out_shape=jax.ShapeDtypeStruct(rows.shape, x.dtype),
        grid=(rows.shape[0],),
        in_specs=[block],
        out_specs=block,
        compiler_params=launch_params(cfg, interpret=interpret),
        interpret=interpret,
        name="kerneltune_softmax",
    )(rows)
    return out.reshape(x.shape)


class TritonBackend(SoftmaxGradient):
    """Our Pallas softmax with a tuned warp count, lowered by Triton."""

    name = "triton"
    lowering = "triton"
    interprets = True

    def run(self, kernel, x, *, cfg: SoftmaxConfig):
        return softmax_pallas(x, cfg=cfg, interpret=kernel.use_interpreter())
