"""Softmax through XLA, and its gradient from the output."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def softmax_xla(x: jax.Array) -> jax.Array:
    """Softmax over the last axis, computed in float32, returned in x's dtype."""
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def softmax_backward(out: jax.Array, dout: jax.Array) -> jax.Array:
    """dx from the output p: `p · (dout − Σ dout·p)` over the last axis."""
    p = out.astype(jnp.float32)
    g = dout.astype(jnp.float32)
    return (p * (g - jnp.sum(g * p, axis=-1, keepdims=True))).astype(out.dtype)


def softmax_reference(x: jax.Array) -> jax.Array:
    """Softmax in float32 (differentiable by JAX): what tests compare with."""
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1)
