"""The arguments of `attention`: checked and put in the form its kernels take, with the
errors `jax.nn.dot_product_attention` gives for the same input."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune.kernels._args import as_array


def array(name: str, value: Any) -> jax.Array:
    """An argument as a JAX array: whatever `jnp.asarray` takes, as `jax.nn`'s attention
    takes it (nested lists too), but never a `jax.ShapeDtypeStruct`."""
    if isinstance(value, (list, tuple)):
        return jnp.asarray(value)
    return as_array("attention", name, value)


def qkv(query: Any, key: Any, value: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """query, key and value as `[batch, seq, heads, head_dim]`: each of fewer dimensions
    gains leading ones on its own (so `[T, N, H]`, and a `[N, H]` query of one token, are
    calls of batch 1), as `jax.nn.dot_product_attention` reads them. Their dtypes must
    match; whether they are floating is the caller's business."""
    op = "attention"
    named = (("query", query), ("key", key), ("value", value))
    arrays = []
    for name, given in named:
        a = array(name, given)
        if a.ndim > 4:
            raise ValueError(
                f"{op}: {name} must be [batch, seq, heads, head_dim] (or lack leading "
                f"dimensions), got shape {a.shape}."
            )
        arrays.append(a if a.ndim == 4 else a.reshape((1,) * (4 - a.ndim) + a.shape))
    q, k, v = arrays
    # ValueErrors all, in jax.nn's order: value against key, then query against key.
    if k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError(
            f"{op}: value must have key's shape and dtype {k.dtype}{list(k.shape)}, got "
            f"{v.dtype}{list(v.shape)}."
        )
    (b, _, n, h), (bk, _, kh, hk) = q.shape, k.shape
    if (b, h) != (bk, hk):
        raise ValueError(
            f"{op}: query {q.shape} and key {k.shape} must agree on batch and head_dim."
        )
    if q.dtype != k.dtype:
        raise ValueError(f"{op}: query must have key's dtype {k.dtype}, got {q.dtype}.")
    if n % kh:
        raise ValueError(
            f"{op}: key/value heads ({kh}) must divide query heads ({n}) for grouped-query "
            "attention."
        )
    return q, k, v


def only_jax_nn(
    q: jax.Array, window: tuple[int, int] | None, implementation: Any, return_residual: Any
) -> str:
    """Why `jax.nn.dot_product_attention` must compute this call (no kernel of ours
    does), or "" when ours can: the reason names the argument, for errors."""
    if implementation is not None:
        return f"implementation={implementation!r}"
    if return_residual:
        return "return_residual=True"
    if not jnp.issubdtype(q.dtype, jnp.floating):
        return f"a query of dtype {q.dtype}"
    if window is not None and min(window) < 0:
        return f"local_window_size={window} (a negative side)"
    if q.shape[-1] == 0:
        return "a head_dim of 0"
    return ""


def logits_operand(name: str, x: Any, full: tuple[int, ...], dtype: Any) -> Any:
    """A bias or mask as 4 dimensions that broadcast to `full`, `[B, N, T, S]`. A wrong
    dtype is a ValueError and a shape that does not broadcast a TypeError, as in
    `jax.nn.dot_product_attention` (its broadcasting error comes from `lax.add`)."""
    if x is None:
        return None
    a = array(name, x)
    if dtype is not None and a.dtype != dtype:
        raise ValueError(f"attention: {name} must have dtype {np.dtype(dtype)}, got {a.dtype}.")
    if a.ndim > 4:
        raise ValueError(f"attention: {name} must have at most 4 dimensions, got {a.shape}.")
    a = a.reshape((1,) * (4 - a.ndim) + a.shape)
    ok = all(d in (1, f) for d, f in zip(a.shape, full)) and a.shape[1] in (1, full[1])
    if not ok:
        raise TypeError(
            f"attention: {name} must broadcast to [batch, heads, q_len, kv_len] = {full}, "
            f"got {tuple(a.shape)}."
        )
    return a


def lengths(name: str, x: Any, batch: int) -> Any:
    """Sequence lengths: an int32 array `[batch]`, as `jax.nn` requires (other integer
    dtypes, int64 under x64 too, are a ValueError there and here)."""
    if x is None:
        return None
    a = array(name, x)
    if a.shape != (batch,) or a.dtype != np.int32:
        raise ValueError(
            f"attention: {name} must be an int32 array of shape ({batch},), got "
            f"{a.dtype}{list(a.shape)}."
        )
    return a


def segments(query_segment_ids: Any, kv_segment_ids: Any, q_shape, k_shape, unbatched: bool):
    """Both segment id arrays or neither, `[B, T]` and `[B, S]` integers (`[T]`, `[S]`
    for an unbatched call), as int32."""
    if (query_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError(
            "attention: pass both query_segment_ids and kv_segment_ids or neither, got "
            f"query_segment_ids={'None' if query_segment_ids is None else 'an array'} and "
            f"kv_segment_ids={'None' if kv_segment_ids is None else 'an array'}."
        )
    if query_segment_ids is None:
        return None, None
    out = []
    for name, x, (b, length) in (
        ("query_segment_ids", query_segment_ids, q_shape[:2]),
        ("kv_segment_ids", kv_segment_ids, k_shape[:2]),
    ):
        given = array(name, x)
        a = given[None] if unbatched and given.ndim == 1 else given
        if a.shape != (b, length) or not jnp.issubdtype(a.dtype, jnp.integer):
            want = f"({length},)" if unbatched else f"({b}, {length})"
            raise ValueError(
                f"attention: {name} must be an integer array of shape {want}, got "
                f"{given.dtype}{list(given.shape)}."
            )
        out.append(a.astype(jnp.int32))
    return out[0], out[1]


def window(window: Any) -> tuple[int, int] | None:
    """`local_window_size` as `(left, right)`: an int is both. Negative sides are valid
    (`jax.nn` takes them: a window that leaves out the diagonal, or every key); the
    caller decides who computes them."""
    if window is None:
        return None
    message = (
        "attention: local_window_size must be an int or a pair of them (left, right), "
        f"got {window!r}."
    )
    if isinstance(window, (int, np.integer)):
        pair: tuple[Any, ...] = (window, window)
    elif isinstance(window, (tuple, list)):
        pair = tuple(window)
    else:  # a TypeError, as jax.nn's attempt to unpack it
        raise TypeError(message)
    if len(pair) != 2 or not all(isinstance(w, (int, np.integer)) for w in pair):
        raise ValueError(message)
    return int(pair[0]), int(pair[1])


def soft_cap(cap: Any) -> float | None:
    """The soft cap as a float: a positive, finite Python or NumPy number (the kernels
    take it as a constant; an infinite one gave NaNs, `inf · tanh(x / inf)`)."""
    if cap is None:
        return None
    number = isinstance(cap, (int, float, np.integer, np.floating)) and not isinstance(
        cap, (bool, np.bool_)
    )
    if not (number and 0 < float(cap) < math.inf):
        raise ValueError(
            "attention: logits_soft_cap must be a positive finite number (a Python or NumPy "
            f"scalar, not a traced value) or None, got {cap!r}."
        )
    return float(cap)
