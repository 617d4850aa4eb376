"""A Llama-style decoder block and language-model loss in Flax NNX, written against an
`ops` namespace.

`LlamaBlock(config, ops=examples.jax_ops, rngs=...)` is the plain JAX block;
`ops=kerneltune.kernels` gives the same block on kerneltune's tuned ops (its SwiGLU MLP
through `gated_linear_unit`). `LlamaLM` puts a final RMSNorm and a vocabulary-sized
head on top, its loss through `linear_softmax_cross_entropy`. The only thing that
differs is where `ops` comes from.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import jax
import jax.numpy as jnp
from flax import nnx

from examples import jax_ops


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    dim: int = 2048
    heads: int = 16
    kv_heads: int = 4  # grouped-query attention: 4 query heads share each k/v head
    hidden: int = 5632
    vocab: int = 128256
    dtype: str = "bfloat16"

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


TINY = LlamaConfig(dim=64, heads=4, kv_heads=2, hidden=128, vocab=256, dtype="float32")


class LlamaBlock(nnx.Module):
    def __init__(self, config: LlamaConfig, *, ops: ModuleType = jax_ops, rngs: nnx.Rngs):
        c, self.config, self.ops = config, config, ops
        dtype = jnp.dtype(c.dtype)

        def weight(fan_in: int, fan_out: int) -> nnx.Param:
            w = jax.random.normal(rngs.params(), (fan_in, fan_out), jnp.float32)
            return nnx.Param((w / fan_in**0.5).astype(dtype))

        self.attn_norm = nnx.Param(jnp.ones((c.dim,), dtype))
        self.wq = weight(c.dim, c.heads * c.head_dim)
        self.wkv = weight(c.dim, 2 * c.kv_heads * c.head_dim)
        self.wo = weight(c.heads * c.head_dim, c.dim)
        self.mlp_norm = nnx.Param(jnp.ones((c.dim,), dtype))
        # The SwiGLU's gate and up projections, fused as `[dim, 2, hidden]`.
        self.w_gate_up = nnx.Param(
            jnp.stack([weight(c.dim, c.hidden)[...], weight(c.dim, c.hidden)[...]], axis=1)
        )
        self.w_down = weight(c.hidden, c.dim)

    def __call__(self, x: jax.Array) -> jax.Array:
        c, ops = self.config, self.ops
        b, t, _ = x.shape
        h = ops.rms_norm(x, self.attn_norm[...])
        q = ops.matmul(h, self.wq[...]).reshape(b, t, c.heads, c.head_dim)
        k, v = jnp.split(ops.matmul(h, self.wkv[...]), 2, axis=-1)
        k = k.reshape(b, t, c.kv_heads, c.head_dim)
        v = v.reshape(b, t, c.kv_heads, c.head_dim)
        a = ops.attention(q, k, v, is_causal=True).reshape(b, t, c.dim)
        x = x + ops.matmul(a, self.wo[...])
        h = ops.rms_norm(x, self.mlp_norm[...])
        gated = ops.gated_linear_unit(h, self.w_gate_up[...], activation=jax.nn.silu)
        return x + ops.matmul(gated, self.w_down[...])


class LlamaLM(nnx.Module):
    """`blocks` Llama blocks, a final RMSNorm and a `[dim, vocab]` head whose softmax
    cross-entropy against integer labels is the loss (the logits are never returned:
    a memory-efficient loss head need not hold them)."""

    def __init__(
        self, config: LlamaConfig, *, blocks: int = 1, ops: ModuleType = jax_ops, rngs: nnx.Rngs
    ):
        c, self.config, self.ops = config, config, ops
        self.blocks = nnx.List([LlamaBlock(c, ops=ops, rngs=rngs) for _ in range(blocks)])
        self.norm = nnx.Param(jnp.ones((c.dim,), jnp.dtype(c.dtype)))
        head = jax.random.normal(rngs.params(), (c.dim, c.vocab), jnp.float32) / c.dim**0.5
        self.head = nnx.Param(head.astype(jnp.dtype(c.dtype)))

    def loss(self, x: jax.Array, labels: jax.Array) -> jax.Array:
        """The mean next-token loss of inputs `x [batch, seq, dim]` against integer
        `labels [batch, seq]` (float32)."""
        for block in self.blocks:
            x = block(x)
        h = self.ops.rms_norm(x, self.norm[...]).reshape(-1, self.config.dim)
        return self.ops.linear_softmax_cross_entropy(h, labels.reshape(-1), self.head[...])
