"""The checks of `ragged_dot`'s operands, shared by its three kernels' `prepare`:
each error names the argument, its value and what is allowed."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import tracing
from kerneltune.kernels._args import ShapeMismatch, check_contracted
from kerneltune.kernels.ragged_dot import groups as groups_lib


def shape_of(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in getattr(x, "shape", ()))


def check_operands(op: str, lhs: Any, rhs: Any, sizes: Any, *, offset: bool = False) -> None:
    """The forward's `lhs[M, K]`, `rhs[G, K, N]` and `group_sizes[G]` fit one another;
    with `offset` (a `group_offset` call), `rhs` holds `G_local <= G` groups."""
    if getattr(lhs, "ndim", None) != 2:
        raise ShapeMismatch(f"{op}: lhs must be 2-D [M, K], got shape {shape_of(lhs)}.")
    if getattr(rhs, "ndim", None) != 3:
        raise ShapeMismatch(f"{op}: rhs must be 3-D [G, K, N], got shape {shape_of(rhs)}.")
    if offset:
        check_sizes(op, sizes, None)
        groups_lib.check_local(op, sizes, int(rhs.shape[0]))
    elif getattr(sizes, "ndim", None) != 1 or sizes.shape[0] != rhs.shape[0]:
        raise ShapeMismatch(
            f"{op}: group_sizes must be 1-D [G] with G = rhs.shape[0] = {rhs.shape[0]}, got "
            f"shape {shape_of(sizes)}."
        )
    check_contracted(op, ("lhs", "rhs"), lhs, rhs, (1, 1), " (K)")
    if not jnp.issubdtype(sizes.dtype, jnp.integer):
        raise TypeError(f"{op}: group_sizes must have an integer dtype, got {sizes.dtype}.")


def check_pair(
    op: str,
    names: tuple[str, str],
    a: Any,
    b: Any,
    *,
    ndims: tuple[int, int],
    layouts: str,
    axes: tuple[int, int],
    agree: str,
) -> None:
    """A backward kernel's two arrays: `a` and `b` have `ndims` dimensions (`layouts`
    says which, e.g. "[M, N] and [G, K, N]") and `a.shape[i] == b.shape[j]` for
    `axes == (i, j)` (`agree` says what that means, e.g. "agree on N")."""
    na, nb = names
    if getattr(a, "ndim", None) != ndims[0] or getattr(b, "ndim", None) != ndims[1]:
        raise ShapeMismatch(
            f"{op}: {na} and {nb} must be {layouts}, got shapes {shape_of(a)} and {shape_of(b)}."
        )
    if a.shape[axes[0]] != b.shape[axes[1]]:
        raise ShapeMismatch(f"{op}: {na} {shape_of(a)} and {nb} {shape_of(b)} must {agree}.")


def check_sizes(op: str, sizes: Any, groups: int | None) -> None:
    if getattr(sizes, "ndim", None) != 1 or (groups is not None and sizes.shape[0] != groups):
        want = "[G]" if groups is None else f"[{groups}]"
        raise ShapeMismatch(f"{op}: group_sizes must be 1-D {want}, got shape {shape_of(sizes)}.")
    if not jnp.issubdtype(sizes.dtype, jnp.integer):
        raise TypeError(f"{op}: group_sizes must have an integer dtype, got {sizes.dtype}.")


def check_floats(op: str, names: tuple[str, str], a: Any, b: Any) -> None:
    if np.dtype(a.dtype) != np.dtype(b.dtype) or not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(
            f"{op}: {names[0]} and {names[1]} must share one floating dtype, got "
            f"{a.dtype} and {b.dtype}."
        )


def check_preferred(op: str, value: Any) -> np.dtype | None:
    """`preferred_element_type` as a NumPy dtype (None stays None), or a TypeError."""
    if value is None:
        return None
    try:
        return np.dtype(value)
    except TypeError as e:
        raise TypeError(
            f"{op}: preferred_element_type must be None or a dtype, got {value!r}."
        ) from e


def out_dtype_name(out_dtype: Any, default: Any) -> str:
    return np.dtype(default if out_dtype is None else out_dtype).name


def check_offset(op: str, group_offset: Any, groups: int, local: int) -> jax.Array:
    """`group_offset` as the int32 `(1,)` array the kernels take, or an error naming
    the argument, its value and what is allowed: an int or an integer array of shape
    `()` or `(1,)`, in `[0, G − G_local]` where it is concrete (a traced one is
    clipped into that range when the kernels run)."""
    allowed = "an int or an integer array of shape () or (1,)"
    if isinstance(group_offset, bool) or not (
        isinstance(group_offset, (int, np.integer)) or hasattr(group_offset, "dtype")
    ):
        raise TypeError(
            f"{op}: group_offset must be {allowed}, got {type(group_offset).__name__} "
            f"{group_offset!r:.60}."
        )
    x = jnp.asarray(group_offset)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{op}: group_offset must be {allowed}, got dtype {x.dtype}.")
    if x.shape not in ((), (1,)):
        raise ValueError(f"{op}: group_offset must be {allowed}, got shape {x.shape}.")
    if not tracing.is_tracer(x):
        value = int(np.asarray(x).reshape(()))
        if not 0 <= value <= groups - local:
            raise ValueError(
                f"{op}: group_offset must lie in [0, G - G_local] = [0, {groups - local}] "
                f"(G = {groups} groups in group_sizes, G_local = {local} in rhs), got {value}."
            )
    return groups_lib.as_offset(x)
