"""The grouped matmul's XLA path: `jax.lax.ragged_dot` and the two products of its
gradient in plain JAX (the reference every backend is tested against, and the CPU
path).

`jax.lax.ragged_dot` takes no `group_offset` (it raises NotImplementedError). With one,
this path moves the local rows `[start, end)` to the top (`groups.shift_rows`), runs
`jax.lax.ragged_dot` on the local groups, and moves the result back: the rows after the
local groups come out zero, and so do the rows moved round from before `start`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels.ragged_dot.groups import group_bounds, shift_rows
from kerneltune.kernels.ragged_dot.groups import local_groups as groups_of


def rows_after_groups_zeroed(out: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """`out` with the rows after the last group zeroed, as `jax.lax.ragged_dot` gives
    them: JAX's Mosaic kernel leaves them unwritten, and tokamax's does not zero them
    either."""
    total = jnp.sum(group_sizes.astype(jnp.int32))
    rows = jax.lax.broadcasted_iota(jnp.int32, out.shape, 0)
    return jnp.where(rows < total, out, jnp.zeros((), out.dtype))


def local_ragged_dot(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array | None,
    **options: Any,
) -> jax.Array:
    """`jax.lax.ragged_dot(lhs, rhs, group_sizes, **options)`; with `group_offset`, for
    the `rhs.shape[0]` local groups from there on: `lhs`'s rows moved up so the local
    groups start at row 0, and the result moved back (its rows outside the local groups
    zero, as `jax.lax.ragged_dot`'s after its last group are)."""
    if group_offset is None:
        return jax.lax.ragged_dot(lhs, rhs, group_sizes, **options)
    sizes, start = groups_of(group_sizes, group_offset, rhs.shape[0], lhs.shape[0])
    return shift_rows(jax.lax.ragged_dot(shift_rows(lhs, -start), rhs, sizes, **options), start)


def ragged_dot_xla(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array | None = None,
    *,
    out_dtype: str,
    precision: Any = None,
) -> jax.Array:
    """`jax.lax.ragged_dot(lhs, rhs, group_sizes)` with output dtype `out_dtype`; with
    `group_offset`, the rows of `rhs.shape[0]` groups from there on."""
    want = np.dtype(out_dtype)
    pref = None if want == np.dtype(lhs.dtype) else want
    return local_ragged_dot(
        lhs, rhs, group_sizes, group_offset, precision=precision, preferred_element_type=pref
    )


def ragged_dot_by_groups(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array | None = None,
    *,
    out_dtype: str,
) -> jax.Array:
    """`ragged_dot_xla`'s values, one group's product at a time (a `lax.scan` over the
    `rhs.shape[0]` groups, each row kept from its own group's product), in float32
    until the end.

    The op's reference for tuning's output checks and second derivatives: the lowering
    of `jax.lax.ragged_dot` holds every group's product of every row at once, G x M x
    (K + N) elements (548 MiB of temporaries for a 4096 x 512 -> 256 product over 64
    groups on XLA:CPU, about 28 GiB at 32768 x 2048 -> 768 over 128), where this holds
    one `[M, N]` product and the float32 sum. Both do G dense products' arithmetic."""
    m, n = lhs.shape[0], rhs.shape[-1]
    sizes, start = group_sizes, None
    if group_offset is not None:
        sizes, start = groups_of(group_sizes, group_offset, rhs.shape[0], m)
    begins, ends = group_bounds(sizes, m, start)
    rows = jax.lax.broadcasted_iota(jnp.int32, (m, 1), 0)

    def add_group(total: jax.Array, g: jax.Array) -> tuple[jax.Array, None]:
        product = jnp.dot(lhs, rhs[g], preferred_element_type=jnp.float32)
        own = (rows >= begins[g]) & (rows < ends[g])
        return total + jnp.where(own, product, 0.0), None

    total, _ = jax.lax.scan(
        add_group, jnp.zeros((m, n), jnp.float32), jnp.arange(rhs.shape[0], dtype=jnp.int32)
    )
    return total.astype(np.dtype(out_dtype))


def ragged_dot_dlhs_xla(
    dout: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array | None = None,
    *,
    out_dtype: str,
) -> jax.Array:
    """`d_lhs[M, K]`: each row of `dout[M, N]` times its group's `rhs[g]ᵀ` (zero outside
    the local groups with `group_offset`)."""
    rhs_t = jnp.swapaxes(rhs, 1, 2)
    return local_ragged_dot(
        dout, rhs_t, group_sizes, group_offset, preferred_element_type=np.dtype(out_dtype)
    )


def ragged_dot_drhs_xla(
    lhs: jax.Array,
    dout: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array | None = None,
    *,
    out_dtype: str,
    local_groups: int | None = None,
) -> jax.Array:
    """`d_rhs[G, K, N]`: `lhs[rows of g]ᵀ · dout[rows of g]` per group, the form of
    `jax.lax.ragged_dot_general` whose ragged axis is contracted; with `group_offset`,
    for the `local_groups` groups from there on (`[local_groups, K, N]`)."""
    numbers = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((0,), (0,)), ((), ())),
        lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[],
    )

    def dot(a: jax.Array, b: jax.Array, sizes: jax.Array) -> jax.Array:
        return jax.lax.ragged_dot_general(
            a, b, sizes, numbers, preferred_element_type=np.dtype(out_dtype)
        )

    if group_offset is None:
        return dot(lhs, dout, group_sizes)
    assert local_groups is not None
    sizes, start = groups_of(group_sizes, group_offset, local_groups, lhs.shape[0])
    return dot(shift_rows(lhs, -start), shift_rows(dout, -start), sizes)


def ragged_dot_reference(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array | None = None,
) -> jax.Array:
    """`jax.lax.ragged_dot` at the highest precision, in float32: what tests compare
    with."""
    return ragged_dot_xla(
        lhs.astype(jnp.float32),
        rhs.astype(jnp.float32),
        group_sizes,
        group_offset,
        out_dtype="float32",
        precision=jax.lax.Precision.HIGHEST,
    )


class XlaBackend(Backend):
    """`jax.lax.ragged_dot` and its gradient's two products in plain JAX: the CPU path,
    and a GPU candidate JAX differentiates itself."""

    name = "xla"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, a, b, group_sizes, group_offset=None, *, cfg, out_dtype: str, **kw):
        if kernel.product == "fwd":
            return ragged_dot_xla(a, b, group_sizes, group_offset, out_dtype=out_dtype)
        if kernel.product == "dlhs":
            return ragged_dot_dlhs_xla(a, b, group_sizes, group_offset, out_dtype=out_dtype)
        return ragged_dot_drhs_xla(a, b, group_sizes, group_offset, out_dtype=out_dtype, **kw)
