"""Argument checks and axis handling shared by the bundled ops' public functions, so
that every op reports bad input the same way: the op, the argument, its value, and
what is allowed."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import jax_compat


class ShapeMismatch(ValueError, TypeError):
    """Operands whose shapes do not fit one another (a contracted dimension, a count of
    groups). A ValueError, and a TypeError as well because JAX raises TypeError for the
    same mistake (`jax.lax.dot_general`, `jax.lax.ragged_dot`): code written against
    either catches it."""


def as_array(op: str, name: str, value: Any) -> jax.Array:
    """`value` as a JAX array, or a TypeError naming the argument."""
    if isinstance(value, jax.ShapeDtypeStruct):  # has a shape and a dtype, holds no values
        raise TypeError(
            f"{op}: {name} must be an array, got jax.ShapeDtypeStruct{value.shape}; for "
            f"shapes and dtypes alone, call {op} under jax.eval_shape."
        )
    if isinstance(value, jax.Array):  # tracers too: as they are (`jnp.asarray` would
        return value  # return the same array, after a dispatch that costs an eager call 10 us)
    if isinstance(value, (np.ndarray, np.generic, int, float, bool, complex)):
        return jnp.asarray(value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # tracers and other arrays
        return jnp.asarray(value)
    raise TypeError(f"{op}: {name} must be an array, got {type(value).__name__} {value!r:.60}.")


def check_contracted(
    op: str, names: tuple[str, str], a: Any, b: Any, axes: tuple[int, int], note: str = ""
) -> None:
    """Raises ShapeMismatch unless `a.shape[i] == b.shape[j]` for `axes == (i, j)`, the
    dimension a product of `a` and `b` contracts; `note` follows the rule in the
    message (e.g. " (K)")."""
    (na, nb), (i, j) = names, axes
    if a.shape[i] != b.shape[j]:
        raise ShapeMismatch(
            f"{op}: {na} is {tuple(a.shape)} and {nb} is {tuple(b.shape)}; {na}.shape[{i}] "
            f"must equal {nb}.shape[{j}]{note}."
        )


def floating(op: str, name: str, x: jax.Array) -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{op}: {name} must have a floating dtype, got {x.dtype}.")


def normalize_axes(op: str, axis: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    """`axis` (an int or a sequence of ints, negative counting from the end) as sorted
    non-negative axes of an array of `ndim` dimensions.

    Example:
      >>> normalize_axes("op", -1, 3)
      (2,)
      >>> normalize_axes("op", (0, -1), 3)
      (0, 2)
    """
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if not axes or not all(isinstance(a, (int, np.integer)) for a in axes):
        raise TypeError(f"{op}: axis must be an int or a non-empty tuple of ints, got {axis!r}.")
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(
                f"{op}: axis {a} is out of range for an array of {ndim} dimensions "
                f"(allowed: {-ndim}..{ndim - 1})."
            )
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: axis {axis!r} names an axis twice.")
    return tuple(sorted(out))


def symbolic(*arrays: Any) -> bool:
    """Whether any of the arrays has a symbolic dimension (`jax.export` with
    polymorphic shapes): such a call has no concrete shape to key, tune or tile by, so
    the ops run their plain-JAX math on it."""
    return any(not isinstance(d, (int, np.integer)) for a in arrays for d in a.shape)


def axes_last(x: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, Any]:
    """`x` with the `axes` moved last, in their order (a transpose, no reshape: a type
    sharded over explicit mesh axes goes through it), and the function that puts an
    array of that layout back into `x`'s."""
    perm = tuple(a for a in range(x.ndim) if a not in axes) + axes
    if perm == tuple(range(x.ndim)):
        return x, lambda y: y
    inverse = tuple(int(i) for i in np.argsort(perm))
    return transpose(x, perm), lambda y: transpose(y, inverse)


def transpose(x: jax.Array, perm: tuple[int, ...]) -> jax.Array:
    """`jnp.transpose(x, perm)`, for a concrete array in one jitted program (see
    `reshape`)."""
    return _in_one_program(jnp.transpose, x, perm)


def to_rows(x: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, Any]:
    """`x` as `[rows, features]` with the `axes` flattened into the features, and the
    function that puts an array of that shape back into `x`'s layout (symbolic
    dimensions too: their products stay symbolic)."""
    moved, unmove = axes_last(x, axes)
    feature = math.prod(x.shape[a] for a in axes)
    rows = reshape(moved, (math.prod(moved.shape[: x.ndim - len(axes)]), feature))
    return rows, lambda y: unmove(reshape(y, moved.shape))


def last_axis_rows(x: jax.Array) -> jax.Array:
    """`x` as `[rows, x.shape[-1]]`. The row count is spelled out: `reshape((-1, 0))`
    cannot infer it (JAX raises ZeroDivisionError), and a zero-sized last axis is a
    valid input (`jnp.matmul` of `[m, 0] @ [0, n]` is zeros)."""
    return reshape(x, (int(np.prod(x.shape[:-1], dtype=np.int64)), x.shape[-1]))


def reshape(x: jax.Array, shape: tuple[Any, ...]) -> jax.Array:
    """`x.reshape(shape)`: `x` itself where it has that shape, and for a concrete
    array one jitted program. JAX runs an eager reshape through its slower path for
    single primitives: on a CPU about 20 µs, where a jitted call takes about 4 (an eager
    `[2, 4, 128]` `layer_norm` took 61 µs, 40 of them its reshape to rows and back).
    Under a trace it is the plain reshape (symbolic dimensions too), so a traced call's
    program holds no nested one. `cast` and `transpose` do the same."""
    if tuple(x.shape) == tuple(shape):
        return x
    return _in_one_program(jnp.reshape, x, tuple(shape))


def _eager(x: jax.Array) -> bool:
    """Whether `x` is concrete and no trace is under way: a concrete array a traced
    function closes over (a parameter, say) is reshaped in the caller's program, so
    that the program holds no nested one."""
    return not isinstance(x, jax.core.Tracer) and jax_compat.outside_any_trace()


def _in_one_program(op: Any, x: jax.Array, arg: Any) -> jax.Array:
    """`op(x, arg)`: for a concrete array one jitted program (`_jitted`), under a trace
    the plain operation."""
    return _jitted(op, x, arg) if _eager(x) else op(x, arg)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _jitted(op: Any, x: jax.Array, arg: Any) -> jax.Array:
    return op(x, arg)


def full(n: Any, fill: Any, dtype: Any, *, concrete: bool) -> jax.Array:
    """`jnp.full((n,), fill, dtype)`, the identity of a parameter the caller left out.
    For a concrete (eager) call the same array each time: building it is an eager
    dispatch that cost half of a small norm's call. Under a trace (`concrete` False) a
    fresh `jnp.full`, so that no constant is captured into the program."""
    if concrete and isinstance(n, int):
        return _concrete_full(n, fill, np.dtype(dtype))
    return jnp.full((n,), fill, dtype)


@functools.lru_cache(maxsize=64)
def _concrete_full(n: int, fill: Any, dtype: np.dtype) -> jax.Array:
    return jnp.full((n,), fill, dtype)


def cast(x: jax.Array, dtype: Any) -> jax.Array:
    """`x.astype(dtype)`: `x` itself where it already has that dtype (and is not
    weakly typed: `astype` makes the type strong), and for a concrete array one jitted
    program (see `reshape`)."""
    aval = getattr(x, "aval", None)
    if aval is not None and aval.dtype == dtype and not aval.weak_type:
        return x
    return _in_one_program(jnp.astype, x, np.dtype(dtype))


def feature_param(
    op: str, name: str, value: Any, x: jax.Array, axes: tuple[int, ...]
) -> jax.Array | None:
    """A per-feature parameter (`scale`, `bias`) flattened to `[features]`: its shape
    must be the reduced axes' shape (`(n,)` for one axis)."""
    if value is None:
        return None
    p = as_array(op, name, value)
    want = tuple(x.shape[a] for a in axes)
    if tuple(p.shape) != want:
        raise ValueError(
            f"{op}: {name} must have the shape of the normalised axes {want}, got {tuple(p.shape)}."
        )
    return reshape(p, (math.prod(p.shape),))


def explicitly_sharded(*arrays: Any) -> bool:
    """Whether any of the arrays (None skipped) has a type sharded over an explicit
    mesh axis (`jax.sharding.AxisType.Explicit`, sharding in types). The kernels cannot
    carry such types through: a Pallas call refuses them, and a reshape to rows or a
    product over sharded rows needs an `out_sharding` they do not know. Such calls run
    plain JAX's program, which propagates the shardings as JAX's own ops do.

    Example:
      >>> import jax.numpy as jnp
      >>> explicitly_sharded(jnp.ones((2, 3)), None)
      False
    """
    return any(a is not None and explicitly_sharded_dims(a) for a in arrays)


def explicitly_sharded_dims(x: Any) -> tuple[int, ...]:
    """The dimensions of `x` (None: none) whose type shards them over an explicit
    mesh axis."""
    if x is None:
        return ()
    # Arrays and tracers hold their type: `.aval` costs a twentieth of `jax.typeof` (the
    # check runs on every call).
    aval = getattr(x, "aval", None)
    if aval is None:
        aval = jax.typeof(x)
    sharding = getattr(aval, "sharding", None)
    explicit = getattr(getattr(sharding, "mesh", None), "explicit_axes", ())
    if not explicit:
        return ()
    return tuple(
        dim
        for dim, entry in enumerate(sharding.spec)  # type: ignore[union-attr]
        if any(name in explicit for name in (entry if isinstance(entry, tuple) else (entry,)))
    )
