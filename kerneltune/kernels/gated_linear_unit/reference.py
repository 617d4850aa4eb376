"""The gated linear unit in plain JAX: the "xla" and "xla_split" backends and the tests'
reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend

Weights = Any  # a `[K, 2, N]` array, or a pair of `[K, N]` arrays


def gate_and_up(w: Weights) -> tuple[jax.Array, jax.Array]:
    """The gate and up projections' `[K, N]` weights of either form."""
    if isinstance(w, (tuple, list)):
        return w[0], w[1]
    return w[:, 0, :], w[:, 1, :]


def glu_xla(
    x: jax.Array,
    w: Weights,
    activation: Callable[[jax.Array], jax.Array],
    *,
    split: bool = False,
    precision: Any = None,
) -> jax.Array:
    """`activation(x·W₀) ⊙ (x·W₁)` as plain JAX writes it, in x's dtype. The fused
    weights go through one `dot_general` (one cuBLAS call for both projections), or with
    `split` through two dots over their halves, the other form users write (in training
    on an H200 one is faster at some shapes, the other at others). x may have leading
    dimensions (`[..., K]`). `precision` is the dots' (`jax.lax.dot`'s)."""
    if split or isinstance(w, (tuple, list)):
        w0, w1 = gate_and_up(w)
        gate, up = jnp.dot(x, w0, precision=precision), jnp.dot(x, w1, precision=precision)
    else:
        h = jnp.einsum("...k,kgn->...gn", x, w, precision=precision)
        gate, up = h[..., 0, :], h[..., 1, :]
    return activation(gate) * up


def glu_reference(
    x: jax.Array, w: Weights, activation: Callable[[jax.Array], jax.Array]
) -> jax.Array:
    """The same in float32 at the highest precision: what tests compare with."""
    gate, up = gate_and_up(w)
    hi = jax.lax.Precision.HIGHEST
    x = x.astype(jnp.float32)
    return activation(jnp.dot(x, gate.astype(jnp.float32), precision=hi)) * jnp.dot(
        x, up.astype(jnp.float32), precision=hi
    )


class XlaBackend(Backend):
    """XLA's GLU: one dot over the fused `[K, 2N]` weights (or two over a pair),
    differentiated by JAX. The CPU path and the untuned config."""

    name = "xla"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, x, w, *, cfg, activation):
        return glu_xla(x, w, activation)


class XlaSplitBackend(Backend):
    """XLA's GLU as two dots over the fused weights' halves (another fusion)."""

    name = "xla_split"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, x, w, *, cfg, activation):
        return glu_xla(x, w, activation, split=True)
