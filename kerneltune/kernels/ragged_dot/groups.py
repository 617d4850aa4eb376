"""The local groups of a `group_offset` call (expert parallelism).

With `group_offset`, `group_sizes` holds all `G` groups of a globally sorted batch and
`rhs` only `G_local` of them: the call computes the rows of groups `group_offset …
group_offset + G_local − 1` (rows `[start, end)` of `lhs`) with `rhs[g − group_offset]`,
and every other row of the output is zero. Every backend reduces such a call to the
same two facts, computed here once: the local groups' sizes and the first local row.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def as_offset(group_offset: Any) -> jax.Array:
    """`group_offset` (an int, or an integer array of shape `()` or `(1,)`) as the int32
    `(1,)` array the kernels take (the shape `jax.lax.ragged_dot_general` documents)."""
    return jnp.asarray(group_offset).astype(jnp.int32).reshape((1,))


def local_groups(
    group_sizes: jax.Array, group_offset: jax.Array, local: int, m: int
) -> tuple[jax.Array, jax.Array]:
    """The `local` groups from `group_offset` on: their sizes (int32 `[local]`, cut
    so that they end by row `m`) and their first row (an int32 scalar, at most `m`).

    An offset outside `[0, G − local]` (possible only when it is traced: concrete ones
    are refused by the public function) is clipped into that range.

    Example:
      >>> import jax.numpy as jnp
      >>> sizes, start = local_groups(jnp.array([3, 1, 4, 1, 5]), jnp.array([2]), 2, 16)
      >>> sizes.tolist(), int(start)
      ([4, 1], 4)
    """
    g = group_sizes.shape[0]
    sizes = group_sizes.astype(jnp.int32)
    offset = jnp.clip(group_offset.reshape(()).astype(jnp.int32), 0, g - local)
    before = jnp.sum(jnp.where(jnp.arange(g, dtype=jnp.int32) < offset, sizes, 0))
    start = jnp.minimum(before, m)
    ends = jnp.minimum(start + jnp.cumsum(lax.dynamic_slice(sizes, (offset,), (local,))), m)
    return jnp.diff(ends, prepend=start[None]).astype(jnp.int32), start


def group_bounds(
    group_sizes: jax.Array, m: int, start: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """Each group's first row and one past its last, the first group starting at row
    `start` (0 when None), clipped to the `m` rows there are (int32 `[G]` each)."""
    first = jnp.zeros((1,), jnp.int32) if start is None else start.astype(jnp.int32).reshape(1)
    ends = jnp.minimum(first + jnp.cumsum(group_sizes.astype(jnp.int32)), m)
    starts = jnp.concatenate([jnp.minimum(first, m), ends[:-1]])
    return starts, ends


def row_range(sizes: jax.Array, start: jax.Array | None, m: int) -> tuple[jax.Array, jax.Array]:
    """The first row of the groups `sizes` (from row `start`, 0 when None) and one past
    their last, both clipped to the `m` rows there are."""
    first = jnp.zeros((), jnp.int32) if start is None else start.astype(jnp.int32)
    end = jnp.minimum(first + jnp.sum(sizes.astype(jnp.int32)), m)
    return jnp.minimum(first, m), end


def rows_outside_zeroed(out: jax.Array, start: jax.Array, end: jax.Array) -> jax.Array:
    """`out` with the rows outside `[start, end)` set to zero (a select: whatever a
    kernel left there, NaN included, becomes zero)."""
    rows = lax.broadcasted_iota(jnp.int32, out.shape, 0)
    return jnp.where((rows >= start) & (rows < end), out, jnp.zeros((), out.dtype))


def shift_rows(x: jax.Array, shift: jax.Array) -> jax.Array:
    """`x` with row `i` moved to row `i + shift` (mod the rows): how the plain-JAX path
    brings the local rows to the top for `jax.lax.ragged_dot`, and its result back."""
    return jnp.roll(x, shift, axis=0)


def check_local(op: str, group_sizes: Any, local: int) -> None:
    """`group_sizes` holds at least the `local` groups `rhs` has."""
    g = int(np.shape(group_sizes)[0])
    if local > g:
        raise ValueError(
            f"{op}: with group_offset, rhs holds G_local = {local} groups and group_sizes all "
            f"G of them, so G_local <= G is required; got group_sizes of shape ({g},)."
        )
