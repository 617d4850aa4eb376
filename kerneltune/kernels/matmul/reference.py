"""The matmul's XLA path: `jnp.dot`, accumulating in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend


def matmul_xla(x: jax.Array, y: jax.Array) -> jax.Array:
    """`x @ y` through XLA (cuBLAS on GPUs, Eigen on CPUs), in `x`'s dtype."""
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def matmul_reference(x: jax.Array, y: jax.Array) -> jax.Array:
    """`x @ y` at the highest precision, in float32: what tests compare with."""
    return jnp.dot(
        x.astype(jnp.float32), y.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
    )


class XlaBackend(Backend):
    """`jnp.dot` through XLA (cuBLAS on GPUs), differentiated by JAX (dot_general
    dimension numbers, no materialised transposes)."""

    name = "xla"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, x, y, *, cfg):
        if kernel.runs_pallas():
            return jnp.dot(x, y)  # a GPU: exactly what plain JAX runs, no f32 round trip
        return matmul_xla(x, y)  # the CPU path accumulates in float32
