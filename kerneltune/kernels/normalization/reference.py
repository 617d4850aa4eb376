"""Layer norm and RMS norm through XLA (statistics in float32, or float64 for float64
inputs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.kernel.backends import Backend


def _stats_dtype(x: jax.Array) -> np.dtype:
    """float64 for float64 inputs (as flax's norms), else float32: float32 statistics
    of a float64 array cost it half its digits. (Not `jnp.promote_types`: it refuses
    float64 with float32 under strict dtype promotion.)"""
    return np.dtype(np.float64 if x.dtype == np.float64 else np.float32)


def layer_norm_xla(
    x: jax.Array, weight: jax.Array, bias: jax.Array, *, eps: float, features: int = 1
) -> jax.Array:
    """`(x − mean) / sqrt(var + eps) · weight + bias` over the last `features` axes
    (`weight` and `bias` have their shape)."""
    f = _stats_dtype(x)
    xf = x.astype(f)
    axes = tuple(range(-features, 0))
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + jnp.asarray(eps, f))
    return (y * weight.astype(f) + bias.astype(f)).astype(x.dtype)


def rms_norm_xla(x: jax.Array, weight: jax.Array, *, eps: float, features: int = 1) -> jax.Array:
    """`x / sqrt(mean(x²) + eps) · weight` over the last `features` axes (`weight` has
    their shape)."""
    f = _stats_dtype(x)
    xf = x.astype(f)
    ms = jnp.mean(jnp.square(xf), axis=tuple(range(-features, 0)), keepdims=True)
    return (xf * jax.lax.rsqrt(ms + jnp.asarray(eps, f)) * weight.astype(f)).astype(x.dtype)


def layer_norm_reference(x, weight, bias, *, eps: float = 1e-5):
    """Layer norm in float32 (differentiable by JAX): what tests compare with."""
    f32 = jnp.float32
    return layer_norm_xla(x.astype(f32), weight.astype(f32), bias.astype(f32), eps=eps)


def rms_norm_reference(x, weight, *, eps: float = 1e-5):
    """RMS norm in float32 (differentiable by JAX): what tests compare with."""
    f32 = jnp.float32
    return rms_norm_xla(x.astype(f32), weight.astype(f32), eps=eps)


class XlaBackend(Backend):
    """XLA's norm, differentiated (and fused) by JAX itself: the CPU path, and a GPU
    candidate."""

    name = "xla"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, x, *params, cfg, eps: float):
        if kernel.which == "layer_norm":
            weight, bias = params
            return layer_norm_xla(x, weight, bias, eps=eps)
        (weight,) = params
        return rms_norm_xla(x, weight, eps=eps)
