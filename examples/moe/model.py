"""A mixture-of-experts block written once against an ops namespace: the same code
runs on `jax.lax.ragged_dot`, on tokamax's `ragged_dot` and on kerneltune's.

Router (a linear layer and a softmax), top-k experts per token, the routed copies of
the tokens sorted by expert, gate/up/down grouped matmuls with SwiGLU, and the expert
outputs combined back per token, weighted by the router's renormalised top-k weights.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

RaggedDot = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class MoEShape:
    """`tokens` tokens of width `d`, `experts` experts of hidden width `f`, `top_k`
    experts per token; `skew` > 0 biases the router towards a few experts (0: roughly
    balanced), and `dead` experts get a large negative bias (no tokens)."""

    name: str
    tokens: int
    d: int
    f: int
    experts: int
    top_k: int
    skew: float = 0.0
    dead: int = 0

    def __str__(self) -> str:
        routing = "balanced" if not self.skew else f"skew{self.skew:g}"
        dead = f" dead{self.dead}" if self.dead else ""
        return f"{self.name} T{self.tokens} D{self.d} F{self.f} E{self.experts}k{self.top_k} {routing}{dead}"


#: Fine-grained (64 experts, top-8) and coarse (8 experts, top-2) blocks on a GPU.
GPU_SHAPES = (
    MoEShape("fine", 4096, 2048, 1408, 64, 8),
    MoEShape("fine", 4096, 2048, 1408, 64, 8, skew=2.0),
    MoEShape("coarse", 8192, 4096, 14336, 8, 2),
    MoEShape("coarse", 8192, 4096, 14336, 8, 2, skew=2.0),
)
#: The same block at sizes a CPU trains in moments.
TINY = MoEShape("tiny", 32, 16, 24, 4, 2)


def ops_namespace(name: str, ragged_dot: RaggedDot, *, takes_group_offset: bool = False) -> Any:
    """The ops the block needs (only `ragged_dot` differs between implementations).
    `takes_group_offset`: its `ragged_dot` takes `group_offset=` (kerneltune's);
    `ragged_dot_at` gives the others one by renumbering the groups."""
    return types.SimpleNamespace(
        name=name, ragged_dot=ragged_dot, takes_group_offset=takes_group_offset
    )


def jax_ops() -> Any:
    return ops_namespace("jax", jax.lax.ragged_dot)


def kerneltune_ops(executor: Any = None) -> Any:
    from kerneltune.kernels import ragged_dot

    def rd(a: jax.Array, b: jax.Array, s: jax.Array, group_offset: Any = None) -> jax.Array:
        return ragged_dot(a, b, s, group_offset=group_offset, executor=executor)

    return ops_namespace("kerneltune", rd, takes_group_offset=True)


def tokamax_ops(tokamax: Any) -> Any:
    return ops_namespace("tokamax", lambda a, b, s: tokamax.ragged_dot(a, b, s))


def ragged_dot_at(
    ops: Any, rows: jax.Array, w: jax.Array, sizes: jax.Array, group_offset: Any
) -> jax.Array:
    """`ops.ragged_dot` of the `w.shape[0]` groups from `group_offset` on (`sizes`
    holds all groups; the other rows give zeros). An op that takes no `group_offset`
    (`jax.lax.ragged_dot`, tokamax: both raise NotImplementedError for one) gets the
    same work renumbered: the local rows moved to the top, the local groups' sizes,
    and the result moved back."""
    if ops.takes_group_offset:
        return ops.ragged_dot(rows, w, sizes, group_offset=group_offset)
    local = w.shape[0]
    offset = jnp.asarray(group_offset, jnp.int32).reshape(())
    start = jnp.sum(jnp.where(jnp.arange(sizes.shape[0]) < offset, sizes, 0))
    mine = jax.lax.dynamic_slice(sizes, (offset,), (local,))
    out = ops.ragged_dot(jnp.roll(rows, -start, axis=0), w, mine)
    return jnp.roll(out, start, axis=0)


def init_params(s: MoEShape, dtype: Any = jnp.bfloat16, seed: int = 0) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.key(seed), 4)

    def w(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
        return (jax.random.normal(key, shape, jnp.float32) / np.sqrt(fan_in)).astype(dtype)

    return {
        "router": w(keys[0], (s.d, s.experts), s.d).astype(jnp.float32),
        "gate": w(keys[1], (s.experts, s.d, s.f), s.d),
        "up": w(keys[2], (s.experts, s.d, s.f), s.d),
        "down": w(keys[3], (s.experts, s.f, s.d), s.f),
    }


def router_bias(s: MoEShape) -> jax.Array:
    """A fixed bias on the router's logits: Zipf-like popularity for skewed routing,
    and a large negative one for dead experts."""
    bias = -s.skew * np.log(np.arange(1, s.experts + 1, dtype=np.float32))
    if s.dead:
        bias[-s.dead :] = -1e4
    return jnp.asarray(bias, jnp.float32)


def route(
    p: dict[str, jax.Array], x: jax.Array, s: MoEShape
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The router and top-k for tokens `x[T, D]`: the `T * top_k` routed copies sorted
    by expert (`rows`), the token each came from, its renormalised router weight, and
    the tokens per expert (`[experts]`)."""
    t = x.shape[0]
    logits = jnp.dot(x.astype(jnp.float32), p["router"]) + router_bias(s)
    weights, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), s.top_k)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    token = (jnp.arange(t * s.top_k, dtype=jnp.int32) // s.top_k)[order]
    sizes = jnp.bincount(flat, length=s.experts).astype(jnp.int32)
    return x[token], token, weights.reshape(-1)[order], sizes


def swiglu_experts(
    ops: Any, p: dict[str, jax.Array], rows: jax.Array, sizes: jax.Array, group_offset: Any = None
) -> jax.Array:
    """Each row through its expert's SwiGLU (`p`'s gate, up and down hold the
    experts): three grouped matmuls. With `group_offset`, `p` holds the experts from
    there on and `sizes` all groups; other rows give zeros."""

    def rd(a: jax.Array, w: jax.Array) -> jax.Array:
        if group_offset is None:
            return ops.ragged_dot(a, w, sizes)
        return ragged_dot_at(ops, a, w, sizes, group_offset)

    gate = rd(rows, p["gate"])
    up = rd(rows, p["up"])
    hidden = (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(rows.dtype)
    return rd(hidden, p["down"])


def combine(out: jax.Array, weights: jax.Array, token: jax.Array, t: int) -> jax.Array:
    """The expert outputs `out` (one per routed copy) weighted and summed per token:
    `[t, D]` in float32."""
    weighted = out.astype(jnp.float32) * weights[:, None]
    return jnp.zeros((t, out.shape[1]), jnp.float32).at[token].add(weighted)


def moe_block(ops: Any, p: dict[str, jax.Array], x: jax.Array, s: MoEShape) -> jax.Array:
    """`x[T, D]` through the mixture of experts: `[T, D]` in `x`'s dtype."""
    rows, token, weights, sizes = route(p, x, s)
    out = swiglu_experts(ops, p, rows, sizes)
    return combine(out, weights, token, x.shape[0]).astype(x.dtype)


def loss_fn(ops: Any, s: MoEShape) -> Callable[..., jax.Array]:
    def loss(p: dict[str, jax.Array], x: jax.Array, target: jax.Array) -> jax.Array:
        y = moe_block(ops, p, x, s).astype(jnp.float32)
        return jnp.mean(jnp.square(y - target.astype(jnp.float32)))

    return loss


def train_step(ops: Any, s: MoEShape, lr: float = 0.5) -> Callable[..., Any]:
    """One SGD step: `(params, x, target) -> (params, loss)`."""
    grad = jax.value_and_grad(loss_fn(ops, s))

    def step(p: dict[str, jax.Array], x: jax.Array, target: jax.Array) -> Any:
        loss, g = grad(p, x, target)
        new = jax.tree.map(lambda a, b: (a - lr * b.astype(jnp.float32)).astype(a.dtype), p, g)
        return new, loss

    return step


def inputs(s: MoEShape, dtype: Any = jnp.bfloat16, seed: int = 1) -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (s.tokens, s.d), jnp.float32).astype(dtype)
    return x, jax.random.normal(ky, (s.tokens, s.d), jnp.float32).astype(dtype)
