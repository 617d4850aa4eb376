"""The arguments of `attention`: checked and put in the form its kernels take, with the
errors `jax.nn.dot_product_attention` gives for the same input."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune.kernels._args import as_array


def qkv(query: Any, key: Any, value: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    op = "attention"
    q, k, v = (as_array(op, n, a) for n, a in (("query", query), ("key", key), ("value", value)))
    ranks = (q.ndim, k.ndim, v.ndim)
    if ranks not in ((4, 4, 4), (3, 3, 3)):
        raise ValueError(
            f"{op}: query, key and value must all be [batch, seq, heads, head_dim] or all "
            f"[seq, heads, head_dim], got shapes {q.shape}, {k.shape} and {v.shape}."
        )
    if q.ndim == 3:
        q, k, v = q[None], k[None], v[None]
    if k.shape != v.shape:
        raise ValueError(f"{op}: value must have key's shape {k.shape[-k.ndim :]}, got {v.shape}.")
    (b, _, n, h), (bk, _, kh, hk) = q.shape, k.shape
    if (b, h) != (bk, hk):
        raise ValueError(
            f"{op}: query {q.shape} and key {k.shape} must agree on batch and head_dim."
        )
    if n % kh:
        raise ValueError(
            f"{op}: key/value heads ({kh}) must divide query heads ({n}) for grouped-query "
            "attention."
        )
    if not (q.dtype == k.dtype == v.dtype) or not jnp.issubdtype(q.dtype, jnp.floating):
        raise TypeError(
            f"{op}: query, key and value must share one floating dtype, got "
            f"{q.dtype}, {k.dtype} and {v.dtype}."
        )
    return q, k, v


def logits_operand(name: str, x: Any, full: tuple[int, ...], dtype: Any) -> Any:
    if x is None:
        return None
    a = as_array("attention", name, x)
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"attention: {name} must have dtype {np.dtype(dtype)}, got {a.dtype}.")
    if a.ndim > 4:
        raise ValueError(f"attention: {name} must have at most 4 dimensions, got {a.shape}.")
    a = a.reshape((1,) * (4 - a.ndim) + a.shape)
    ok = all(d in (1, f) for d, f in zip(a.shape, full)) and a.shape[1] in (1, full[1])
    if not ok:
        raise ValueError(
            f"attention: {name} must broadcast to [batch, heads, q_len, kv_len] = {full}, "
            f"got {tuple(a.shape)}."
        )
    return a


def lengths(name: str, x: Any, batch: int) -> Any:
    if x is None:
        return None
    a = as_array("attention", name, x)
    if a.shape != (batch,) or not jnp.issubdtype(a.dtype, jnp.integer):
        raise ValueError(
            f"attention: {name} must be an integer array of shape ({batch},), got "
            f"{a.dtype}{list(a.shape)}."
        )
    return a.astype(jnp.int32)


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
        given = as_array("attention", name, x)
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
    if window is None:
        return None
    pair = (window, window) if isinstance(window, (int, np.integer)) else tuple(window)
    if len(pair) != 2 or not all(
        isinstance(w, (int, np.integer)) and not isinstance(w, bool) and w >= 0 for w in pair
    ):
        raise ValueError(
            "attention: local_window_size must be a non-negative int or a pair of them "
            f"(left, right), got {window!r}."
        )
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
