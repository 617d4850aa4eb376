"""The mixture-of-experts layer whose training step the demo times: router, top-k
experts per token, the routed copies sorted by expert, SwiGLU experts through three
grouped matmuls (`ragged_dot`), the outputs combined per token.

It is `examples/moe/model.py`'s balanced block (what BENCHMARKS.md's MoE rows time)
with the grouped matmul passed in, written again here because the package cannot
import the examples; `tests/cli/test_demo_cases.py` checks that both compute the same
loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

RaggedDot = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
Params = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class MoEShape:
    """`tokens` tokens of width `d`; `experts` experts of hidden width `f`, `top_k` of
    them per token."""

    tokens: int
    d: int
    f: int
    experts: int
    top_k: int

    def __str__(self) -> str:
        return f"T{self.tokens} D{self.d} F{self.f} E{self.experts} top-{self.top_k}"


def init_params(s: MoEShape, dtype: Any, seed: int = 0) -> Params:
    """Random weights scaled by 1/sqrt(fan-in); the router in float32."""
    keys = jax.random.split(jax.random.key(seed, impl="rbg"), 4)

    def weight(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
        return (jax.random.normal(key, shape, jnp.float32) / fan_in**0.5).astype(dtype)

    return {
        "router": weight(keys[0], (s.d, s.experts), s.d).astype(jnp.float32),
        "gate": weight(keys[1], (s.experts, s.d, s.f), s.d),
        "up": weight(keys[2], (s.experts, s.d, s.f), s.d),
        "down": weight(keys[3], (s.experts, s.f, s.d), s.f),
    }


def inputs(s: MoEShape, dtype: Any, seed: int = 1) -> tuple[jax.Array, jax.Array]:
    """Tokens `[T, D]` and regression targets of the same shape."""
    kx, ky = jax.random.split(jax.random.key(seed, impl="rbg"))
    x = jax.random.normal(kx, (s.tokens, s.d), jnp.float32).astype(dtype)
    return x, jax.random.normal(ky, (s.tokens, s.d), jnp.float32).astype(dtype)


def layer(ragged_dot: RaggedDot, p: Params, x: jax.Array, s: MoEShape) -> jax.Array:
    """`x[T, D]` through the experts: `[T, D]` in float32."""
    t = x.shape[0]
    probs = jax.nn.softmax(jnp.dot(x.astype(jnp.float32), p["router"]), axis=-1)
    weights, experts = jax.lax.top_k(probs, s.top_k)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    token = (jnp.arange(t * s.top_k, dtype=jnp.int32) // s.top_k)[order]
    sizes = jnp.bincount(flat, length=s.experts).astype(jnp.int32)
    rows = x[token]
    gate = ragged_dot(rows, p["gate"], sizes).astype(jnp.float32)
    up = ragged_dot(rows, p["up"], sizes).astype(jnp.float32)
    out = ragged_dot((jax.nn.silu(gate) * up).astype(x.dtype), p["down"], sizes)
    weighted = out.astype(jnp.float32) * weights.reshape(-1)[order][:, None]
    return jnp.zeros((t, x.shape[1]), jnp.float32).at[token].add(weighted)


def train_step(ragged_dot: RaggedDot, s: MoEShape, lr: float = 0.5) -> Callable[..., Any]:
    """One SGD step on the mean squared error: `(params, x, target) -> (params, loss)`."""

    def loss(p: Params, x: jax.Array, target: jax.Array) -> jax.Array:
        y = layer(ragged_dot, p, x, s).astype(x.dtype).astype(jnp.float32)
        return jnp.mean(jnp.square(y - target.astype(jnp.float32)))

    def step(p: Params, x: jax.Array, target: jax.Array) -> tuple[Params, jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, x, target)
        new = jax.tree.map(lambda a, g: (a - lr * g.astype(jnp.float32)).astype(a.dtype), p, grads)
        return new, value

    return step
