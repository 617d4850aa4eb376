"""The ops a transformer block needs, from JAX itself, with `kerneltune.kernels`'
signatures: swap `import examples.jax_ops as ops` for `import kerneltune.kernels as ops`
and nothing else changes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

attention = jax.nn.dot_product_attention
softmax = jax.nn.softmax
matmul = jnp.matmul


def layer_norm(x, scale=None, bias=None, *, axis=-1, epsilon=1e-6):
    """flax's LayerNorm math over `axis`."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(axis, keepdims=True)
    var = jnp.square(xf - mean).mean(axis, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + epsilon)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def rms_norm(x, scale=None, *, axis=-1, epsilon=1e-6):
    """flax's RMSNorm math over `axis`."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.square(xf).mean(axis, keepdims=True) + epsilon)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    return y.astype(x.dtype)


def gated_linear_unit(x, weights, *, activation=jax.nn.silu):
    """`activation(x·W₀) ⊙ (x·W₁)`, weights `[K, 2, N]` or a pair of `[K, N]`."""
    gate, up = weights if isinstance(weights, (tuple, list)) else (weights[:, 0], weights[:, 1])
    return activation(x @ gate) * (x @ up)


def linear_softmax_cross_entropy(x, labels, weights, *, reduction="mean", where=None):
    """`logsumexp(x·W) − (x·W)[label]` per row in float32, reduced (the logits
    materialised)."""
    logits = jnp.dot(x, weights, preferred_element_type=jnp.float32)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    losses = jax.nn.logsumexp(logits, axis=-1) - picked
    mask = jnp.ones(labels.shape, bool) if where is None else where
    losses = jnp.where(mask, losses, 0.0)
    if reduction == "none":
        return losses
    total = jnp.sum(losses)
    return total if reduction == "sum" else total / jnp.sum(mask, dtype=jnp.float32)
