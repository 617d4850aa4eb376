"""Attention with every feature of `jax.nn.dot_product_attention`, plus a logits soft
cap and segment ids, through XLA with the whole `[B, N, T, S]` logits at once: the
reference of the variants, and their path where the sequence is one block of queries.

The math follows JAX's XLA implementation step for step (logits in float32, scaled,
biased, masked with a large negative number, softmax in float32, padded query rows
zeroed), so a call without a soft cap computes what `jax.nn.dot_product_attention`
computes. The soft cap `cap · tanh(logits / cap)` applies to the biased logits,
before masking (as Gemma 2 does). `attend` is one block of that math; the chunked
path (`chunked.py`) runs it a block of queries at a time.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels.attention.masking import Masks, keep, large_negative


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array | None,
    keep_mask: jax.Array | None,
    *,
    scale: Any,
    soft_cap: float | None,
) -> jax.Array:
    """`[B, t, N, H]` queries against `[B, s, K, H]` keys and values (`K` divides `N`):
    `bias` and `keep_mask` are 4-D and broadcast to `[B, N, t, s]`.

    The `N // K` queries that share a key head are mapped over (`jax.vmap`), as
    `jax.nn`'s XLA path does, rather than multiplied as one grouped einsum: on a CPU
    the einsum's logits came out with the group innermost, and moving it cost 1.5-1.7x
    the whole attention's time (`[1, 256, 8, 64]` queries against 2 key heads,
    float32 and bfloat16; BENCHMARKS.md, 2026-12-08)."""
    b, t, n, h = q.shape
    kh = k.shape[2]
    g = n // kh
    logits_dtype = np.dtype(np.float64 if q.dtype == np.float64 else np.float32)

    def one_of_each_group(q1: jax.Array, bias1: Any, keep1: Any) -> jax.Array:
        """`[B, t, K, H]` queries, one per key head; `bias1`/`keep1` broadcast to
        `[B, K, t, s]`."""
        logits = jnp.einsum("btkh,bskh->bkts", q1, k, preferred_element_type=logits_dtype)
        logits = logits * jnp.asarray(scale, dtype=logits_dtype)
        if bias1 is not None:
            logits = logits + bias1.astype(logits_dtype)
        if soft_cap is not None:
            cap = jnp.asarray(soft_cap, dtype=logits_dtype)
            logits = cap * jnp.tanh(logits / cap)
        if keep1 is not None:
            logits = jnp.where(keep1, logits, large_negative(logits_dtype))
        probs = jax.nn.softmax(logits.astype(np.float32), axis=-1).astype(k.dtype)
        return jnp.einsum("bkts,bskh->btkh", probs, v)

    def by_group(x: jax.Array | None) -> tuple[jax.Array | None, int | None]:
        """`x` with its head axis split into (key head, group) and the group's axis,
        or as it is (no axis to map) where its head axis broadcasts."""
        if x is None or x.shape[1] == 1:
            return x, None
        return x.reshape(x.shape[0], kh, g, *x.shape[2:]), 2

    (bias_g, bias_axis), (keep_g, keep_axis) = by_group(bias), by_group(keep_mask)
    grouped = jax.vmap(one_of_each_group, in_axes=(3, bias_axis, keep_axis), out_axes=3)
    out = grouped(q.reshape(b, t, kh, g, h), bias_g, keep_g)
    return out.reshape(b, t, n, v.shape[-1])


def zero_padded_rows(out: jax.Array, q_pos: jax.Array, q_lengths: jax.Array | None) -> jax.Array:
    """Query rows past a batch row's length are zero (as in `jax.nn`)."""
    if q_lengths is None:
        return out
    valid = q_pos[None, :] < q_lengths[:, None]
    return out * valid[:, :, None, None].astype(out.dtype)


def attention_features_xla(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None,
    masks: Masks,
    *,
    scale: Any,
    is_causal: bool,
    local_window_size: tuple[int, int] | None,
    logits_soft_cap: float | None,
) -> jax.Array:
    """Attention over `[B, T, N, H]` queries and `[B, S, K, H]` keys and values with the
    whole logits at once; `bias` and `masks.mask` are 4-D and broadcast to
    `[B, N, T, S]`."""
    t, s = query.shape[1], key.shape[1]
    q_pos = jnp.arange(t)
    keep_mask = keep(q_pos, jnp.arange(s), masks, causal=is_causal, window=local_window_size)
    out = attend(query, key, value, bias, keep_mask, scale=scale, soft_cap=logits_soft_cap)
    return zero_padded_rows(out, q_pos, masks.q_lengths)


class MaterialisingBackend(Backend):
    """Every variant with the whole logits in memory: exact, and the fastest where
    they are small; JAX differentiates it."""

    name = "xla"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, q, k, v, bias, masks, *, cfg, causal, sm_scale, window, soft_cap):
        return attention_features_xla(
            q, k, v, bias, masks, scale=sm_scale, is_causal=causal,
            local_window_size=window, logits_soft_cap=soft_cap,
        )  # fmt: skip
