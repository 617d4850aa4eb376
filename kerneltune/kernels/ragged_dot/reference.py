"""The grouped matmul's XLA path: `jax.lax.ragged_dot` and the two products of its
gradient in plain JAX (the reference every backend is tested against, and the CPU
path)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.kernel.backends import Backend


def rows_after_groups_zeroed(out: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """`out` with the rows after the last group zeroed, as `jax.lax.ragged_dot` gives
    them: JAX's Mosaic kernel leaves them unwritten, and tokamax's does not zero them
    either."""
    total = jnp.sum(group_sizes.astype(jnp.int32))
    rows = jax.lax.broadcasted_iota(jnp.int32, out.shape, 0)
    return jnp.where(rows < total, out, jnp.zeros((), out.dtype))


def ragged_dot_xla(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, out_dtype: str
) -> jax.Array:
    """`jax.lax.ragged_dot(lhs, rhs, group_sizes)` with output dtype `out_dtype`."""
    want = np.dtype(out_dtype)
    pref = None if want == np.dtype(lhs.dtype) else want
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=pref)


def ragged_dot_dlhs_xla(
    dout: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, out_dtype: str
) -> jax.Array:
    """`d_lhs[M, K]`: each row of `dout[M, N]` times its group's `rhs[g]ᵀ`."""
    return jax.lax.ragged_dot(
        dout, jnp.swapaxes(rhs, 1, 2), group_sizes, preferred_element_type=np.dtype(out_dtype)
    )


def ragged_dot_drhs_xla(
    lhs: jax.Array, dout: jax.Array, group_sizes: jax.Array, *, out_dtype: str
) -> jax.Array:
    """`d_rhs[G, K, N]`: `lhs[rows of g]ᵀ · dout[rows of g]` per group, the form of
    `jax.lax.ragged_dot_general` whose ragged axis is contracted."""
    numbers = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((0,), (0,)), ((), ())),
        lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[],
    )
    return jax.lax.ragged_dot_general(
        lhs, dout, group_sizes, numbers, preferred_element_type=np.dtype(out_dtype)
    )


def ragged_dot_reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """`jax.lax.ragged_dot` at the highest precision, in float32: what tests compare
    with."""
    return jax.lax.ragged_dot(
        lhs.astype(jnp.float32),
        rhs.astype(jnp.float32),
        group_sizes,
        precision=jax.lax.Precision.HIGHEST,
    )


class XlaBackend(Backend):
    """`jax.lax.ragged_dot` and its gradient's two products in plain JAX: the CPU path,
    and a GPU candidate JAX differentiates itself."""

    name = "xla"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, a, b, group_sizes, *, cfg, out_dtype: str):
        if kernel.product == "fwd":
            return ragged_dot_xla(a, b, group_sizes, out_dtype=out_dtype)
        if kernel.product == "dlhs":
            return ragged_dot_dlhs_xla(a, b, group_sizes, out_dtype=out_dtype)
        return ragged_dot_drhs_xla(a, b, group_sizes, out_dtype=out_dtype)
