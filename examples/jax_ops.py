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
