"""The fused gated linear unit in Pallas, lowered through Triton on GPUs.

Each program computes one `block_m × block_n` output tile: it walks the shared dimension in steps
of `block_k`, multiplying one `x` tile by the matching gate and up weight tiles into two
float32 accumulators (one pass over `x` serves both projections), then applies the
activation to the gate and multiplies by the up projection before the single store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._common import launch_params, pad_to
from kerneltune.kernels.gated_linear_unit.config import GLUConfig
from kerneltune.kernels.gated_linear_unit.reference import gate_and_up, glu_xla


def _glu_kernel(x_ref, g_ref, u_ref, o_ref, *, block_k: int, steps: int, activation, upcast: bool):
    def step(i, accs):
        acc_g, acc_u = accs
        start = pl.multiple_of(i * block_k, block_k)
        x = x_ref[:, pl.ds(start, block_k)]
        g = g_ref[pl.ds(start, block_k), :]
        u = u_ref[pl.ds(start, block_k), :]
        if upcast:  # the interpreter on CPUs: XLA:CPU has no bf16 x bf16 -> f32 dot
            x, g, u = x.astype(jnp.float32), g.astype(jnp.float32), u.astype(jnp.float32)
        acc_g = acc_g + jnp.dot(x, g, preferred_element_type=jnp.float32)
        acc_u = acc_u + jnp.dot(x, u, preferred_element_type=jnp.float32)
        return acc_g, acc_u

    zeros = jnp.zeros(o_ref.shape, jnp.float32)
    acc_g, acc_u = lax.fori_loop(0, steps, step, (zeros, zeros))
    o_ref[...] = (activation(acc_g) * acc_u).astype(o_ref.dtype)


def glu_pallas(
    x: jax.Array,
    gate: jax.Array,
    up: jax.Array,
    cfg: GLUConfig,
    activation: Callable[[jax.Array], jax.Array],
    *,
    interpret: bool = False,
) -> jax.Array:
    """`activation(x @ gate) * (x @ up)` for 2-D `x[m, k]` and `[k, n]` weights of
    x's dtype. Dimensions the tiles do not divide are zero-padded."""
    assert cfg.block_m and cfg.block_n and cfg.block_k
    m, _ = x.shape
    n = gate.shape[1]
    xp = pad_to(x, (cfg.block_m, cfg.block_k))
    gp = pad_to(gate, (cfg.block_k, cfg.block_n))
    up_p = pad_to(up, (cfg.block_k, cfg.block_n))
    mp, kp = xp.shape
    np_ = gp.shape[1]
    out = pl.pallas_call(
        functools.partial(
            _glu_kernel,
            block_k=cfg.block_k,
            steps=kp // cfg.block_k,
            activation=activation,
            upcast=interpret,
        ),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        grid=(mp // cfg.block_m, np_ // cfg.block_n),
        in_specs=[
            pl.BlockSpec((cfg.block_m, kp), lambda i, j: (i, 0)),
            pl.BlockSpec((kp, cfg.block_n), lambda i, j: (0, j)),
            pl.BlockSpec((kp, cfg.block_n), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((cfg.block_m, cfg.block_n), lambda i, j: (i, j)),
        compiler_params=launch_params(cfg, interpret=interpret),
        interpret=interpret,
        name="kerneltune_gated_linear_unit",
    )(xp, gp, up_p)
    return out if (mp, np_) == (m, n) else out[:m, :n]


class TritonBackend(Backend):
    """Our fused Pallas GLU (both projections and the gate in one kernel), lowered by
    Triton; its backward is XLA's, recomputing the projections."""

    name = "triton"
    lowering = "triton"
    interprets = True

    def run(self, kernel, x, w, *, cfg: GLUConfig, activation):
        gate, up = gate_and_up(w)
        return glu_pallas(x, gate, up, cfg, activation, interpret=kernel.use_interpreter())

    def vjp(self, kernel, residuals, out, dout, x, w, *, cfg: GLUConfig, activation):
        _, pullback = jax.vjp(lambda a, b: glu_xla(a, b, activation), x, w)
        return pullback(dout.astype(out.dtype))
