"""Attention with every feature of `jax.nn.dot_product_attention`, plus a logits soft
cap, through XLA: the path for calls the tuned kernels cannot run.

The math follows JAX's XLA implementation step for step (logits in float32, scaled,
biased, masked with a large negative number, softmax in float32, padded query rows
zeroed), so a call without a soft cap computes what `jax.nn.dot_product_attention`
computes. The soft cap `cap · tanh(logits / cap)` applies to the biased logits,
before masking (as Gemma 2 does).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _large_negative(dtype: Any) -> jax.Array:
    limit = min(float(jnp.finfo(dtype).max), float(jnp.finfo(np.float32).max))
    return jnp.asarray(-0.7 * limit, dtype=dtype)


def _keep_mask(
    t: int,
    s: int,
    mask: jax.Array | None,
    is_causal: bool,
    q_lengths: jax.Array | None,
    kv_lengths: jax.Array | None,
    window: tuple[int, int] | None,
) -> jax.Array | None:
    """Which logits `[B|1, N|1, T, S]` take part, or None when all do."""
    keep = None if mask is None else mask

    def both(m: jax.Array) -> jax.Array:
        return m if keep is None else jnp.logical_and(keep, m)

    q_pos = jnp.arange(t)[:, None]
    k_pos = jnp.arange(s)[None, :]
    if is_causal:
        keep = both((q_pos >= k_pos)[None, None])
    if window is not None:
        left, right = window
        keep = both(((q_pos <= k_pos + left) & (q_pos >= k_pos - right))[None, None])
    if q_lengths is not None or kv_lengths is not None:
        rows = (
            True if q_lengths is None else jnp.arange(t)[None, :, None] < q_lengths[:, None, None]
        )
        cols = (
            True if kv_lengths is None else jnp.arange(s)[None, None, :] < kv_lengths[:, None, None]
        )
        keep = both(jnp.logical_and(rows, cols)[:, None])
    return keep


def attention_features_xla(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None,
    mask: jax.Array | None,
    *,
    scale: Any,
    is_causal: bool,
    query_seq_lengths: jax.Array | None,
    key_value_seq_lengths: jax.Array | None,
    local_window_size: tuple[int, int] | None,
    logits_soft_cap: float | None,
) -> jax.Array:
    """Attention over `[B, T, N, H]` queries and `[B, S, K, H]` keys and values
    (`K` divides `N`); `bias` and `mask` are 4-D and broadcast to `[B, N, T, S]`."""
    b, t, n, h = query.shape
    s, k = key.shape[1], key.shape[2]
    g = n // k
    logits_dtype = jnp.promote_types(query.dtype, np.float32)
    qg = query.reshape(b, t, k, g, h)
    logits = jnp.einsum("btkgh,bskh->bkgts", qg, key, preferred_element_type=logits_dtype).reshape(
        b, n, t, s
    )
    logits = logits * jnp.asarray(scale, dtype=logits_dtype)
    if bias is not None:
        logits = (logits + bias).astype(logits_dtype)
    if logits_soft_cap is not None:
        cap = jnp.asarray(logits_soft_cap, dtype=logits_dtype)
        logits = cap * jnp.tanh(logits / cap)
    keep = _keep_mask(t, s, mask, is_causal, query_seq_lengths, key_value_seq_lengths,
                      local_window_size)  # fmt: skip
    if keep is not None:
        logits = jnp.where(keep, logits, _large_negative(logits_dtype))
    probs = jax.nn.softmax(logits.astype(np.float32), axis=-1).astype(key.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs.reshape(b, k, g, t, s), value)
    out = out.reshape(b, t, n, value.shape[-1])
    if query_seq_lengths is not None:
        valid = jnp.arange(t)[None, :] < query_seq_lengths[:, None]
        out = out * valid[:, :, None, None].astype(out.dtype)
    return out
