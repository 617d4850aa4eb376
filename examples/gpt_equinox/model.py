"""A GPT-style block in Equinox, written against an `ops` namespace.

`GPTBlock(config, key, ops=examples.jax_ops)` is the plain JAX model;
`ops=kerneltune.kernels` gives the same model on kerneltune's tuned ops.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import equinox as eqx
import jax
import jax.numpy as jnp

from examples import jax_ops


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    dim: int = 2048
    heads: int = 16
    hidden: int = 8192
    dtype: str = "bfloat16"


TINY = GPTConfig(dim=64, heads=4, hidden=128, dtype="float32")


class GPTBlock(eqx.Module):
    ln1_scale: jax.Array
    ln1_bias: jax.Array
    w_qkv: jax.Array
    w_out: jax.Array
    ln2_scale: jax.Array
    ln2_bias: jax.Array
    w_up: jax.Array
    w_down: jax.Array
    config: GPTConfig = eqx.field(static=True)
    ops: ModuleType = eqx.field(static=True)

    def __init__(self, config: GPTConfig, key: jax.Array, *, ops: ModuleType = jax_ops):
        dtype = jnp.dtype(config.dtype)
        keys = jax.random.split(key, 4)

        def weight(k: jax.Array, fan_in: int, fan_out: int) -> jax.Array:
            w = jax.random.normal(k, (fan_in, fan_out), jnp.float32) / fan_in**0.5
            return w.astype(dtype)

        d = config.dim
        self.config, self.ops = config, ops
        self.ln1_scale, self.ln1_bias = jnp.ones((d,), dtype), jnp.zeros((d,), dtype)
        self.w_qkv = weight(keys[0], d, 3 * d)
        self.w_out = weight(keys[1], d, d)
        self.ln2_scale, self.ln2_bias = jnp.ones((d,), dtype), jnp.zeros((d,), dtype)
        self.w_up = weight(keys[2], d, config.hidden)
        self.w_down = weight(keys[3], config.hidden, d)

    def __call__(self, x: jax.Array) -> jax.Array:
        c, ops = self.config, self.ops
        b, t, d = x.shape
        h = ops.layer_norm(x, self.ln1_scale, self.ln1_bias)
        q, k, v = jnp.split(ops.matmul(h, self.w_qkv), 3, axis=-1)
        shape = (b, t, c.heads, d // c.heads)
        a = ops.attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), is_causal=True)
        x = x + ops.matmul(a.reshape(b, t, d), self.w_out)
        h = ops.layer_norm(x, self.ln2_scale, self.ln2_bias)
        return x + ops.matmul(jax.nn.gelu(ops.matmul(h, self.w_up)), self.w_down)
