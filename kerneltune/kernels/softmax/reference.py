"""Softmax through XLA, and its gradient from the output."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend


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


class SoftmaxGradient(Backend):
    """Softmax's gradient from its output (`p · (g − Σ g·p)`), whatever computed it."""

    def vjp(self, kernel, residuals, out, dout, x, *, cfg):
        return (softmax_backward(out, dout),)


class XlaBackend(SoftmaxGradient):
    """XLA's softmax, in float32: the CPU path."""

    name = "xla"
    plain_jax = True

    def run(self, kernel, x, *, cfg):
        return softmax_xla(x)
