"""The implementations the model benchmark compares, behind one small interface, and
two transformer blocks built on it.

`Ops` holds one implementation of each op a block needs. `plain_ops` is what a JAX
user has without kerneltune (cuDNN attention through `jax.nn.dot_product_attention`,
norms and softmax as `jnp` math fused by XLA, `jnp.dot` i.e. cuBLAS); `kerneltune_ops`
calls `kerneltune.kernels` with the SPEC §7 signatures; `tokamax_ops` calls tokamax
(which has no plain matmul or softmax: those stay `jnp`).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import sys
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from benchmarks.harness import error_text, normal, on_gpu
from kerneltune import kernels as ktk

EPSILON = 1e-6
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Ops:
    name: str
    layer_norm: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]  # (x, scale, bias)
    rms_norm: Callable[[jax.Array, jax.Array], jax.Array]  # (x, scale)
    attention: Callable[[jax.Array, jax.Array, jax.Array, bool], jax.Array]  # (q, k, v, causal)
    softmax: Callable[[jax.Array], jax.Array]
    matmul: Callable[[jax.Array, jax.Array], jax.Array]
    swiglu: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]  # (x, w_gate, w_up)


def xla_layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    xf = x.astype(F32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + EPSILON) * scale.astype(F32) + bias.astype(F32)
    return y.astype(x.dtype)


def xla_rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    xf = x.astype(F32)
    y = xf * jax.lax.rsqrt(jnp.square(xf).mean(-1, keepdims=True) + EPSILON)
    return (y * scale.astype(F32)).astype(x.dtype)


def jax_attention(implementation: Literal["xla", "cudnn"] | None) -> Callable[..., jax.Array]:
    def attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
        return jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation=implementation
        )

    return attention


def _swiglu_with(matmul: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array) -> jax.Array:
        return jax.nn.silu(matmul(x, w_gate)) * matmul(x, w_up)

    return swiglu


def plain_ops() -> Ops:
    return Ops(
        "plain",
        xla_layer_norm,
        xla_rms_norm,
        jax_attention("cudnn" if on_gpu() else None),
        lambda x: jax.nn.softmax(x, axis=-1),
        jnp.dot,
        _swiglu_with(jnp.dot),
    )


def labelled_ops(ops: Ops) -> Ops:
    """`ops` with every op's instructions labelled as kerneltune labels its calls
    (`kerneltune.label`, a frontend attribute): the same program with only the labels
    added, a control for what labels alone do to XLA's compilation and autotuning."""
    import kerneltune

    fields = {
        f.name: kerneltune.label(f"plain.{f.name}")(getattr(ops, f.name))
        for f in dataclasses.fields(ops)
        if f.name != "name"
    }
    return Ops(f"{ops.name}_labelled", **fields)


def kerneltune_ops(executor: Any = None) -> Ops:
    """kerneltune's ops through `executor` (None: the default executor)."""
    ex = {"executor": executor}

    def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
        return ktk.matmul(a, b, **ex)

    def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array) -> jax.Array:
        return ktk.gated_linear_unit(x, (w_gate, w_up), activation=jax.nn.silu, **ex)

    return Ops(
        "kerneltune",
        lambda x, s, b: ktk.layer_norm(x, s, b, epsilon=EPSILON, **ex),
        lambda x, s: ktk.rms_norm(x, s, epsilon=EPSILON, **ex),
        lambda q, k, v, causal: ktk.attention(q, k, v, is_causal=causal, **ex),
        lambda x: ktk.softmax(x, axis=-1, **ex),
        matmul,
        swiglu,
    )


def import_tokamax() -> Any:
    """The `tokamax` module, or None (said on stderr) where it does not import."""
    try:
        return importlib.import_module("tokamax")
    except Exception as e:  # absent, or present without its dependencies
        print(f"tokamax unavailable ({error_text(e)}): its column stays empty", file=sys.stderr)
        return None


def tokamax_ops(tokamax: Any) -> Ops:
    def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array) -> jax.Array:
        return tokamax.gated_linear_unit(x, (w_gate, w_up), activation=jax.nn.silu)

    return Ops(
        "tokamax",
        lambda x, s, b: tokamax.layer_norm(x, s, b, epsilon=EPSILON),
        lambda x, s: tokamax.layer_norm(x, s, None, epsilon=EPSILON, subtract_mean=False),
        lambda q, k, v, causal: tokamax.dot_product_attention(q, k, v, is_causal=causal),
        lambda x: jax.nn.softmax(x, axis=-1),
        jnp.dot,
        swiglu,
    )


# --- blocks ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlockShape:
    """`batch` sequences of `seq` tokens of width `dim`; `heads` query heads and
    `kv_heads` key/value heads (fewer: grouped-query attention); MLP width `hidden`."""

    batch: int
    seq: int
    dim: int
    heads: int
    kv_heads: int
    hidden: int

    def __str__(self) -> str:
        s = self
        return f"B{s.batch} T{s.seq} D{s.dim} H{s.heads}/{s.kv_heads} F{s.hidden}"


def _weight(seed: int, fan_in: int, fan_out: int) -> jax.Array:
    return normal(seed, (fan_in, fan_out)) * jnp.bfloat16(1 / math.sqrt(fan_in))


def gpt_params(s: BlockShape) -> dict[str, jax.Array]:
    d, ones, zeros = s.dim, jnp.ones((s.dim,), jnp.bfloat16), jnp.zeros((s.dim,), jnp.bfloat16)
    return {
        "ln1_scale": ones, "ln1_bias": zeros, "ln2_scale": ones, "ln2_bias": zeros,
        "qkv": _weight(1, d, 3 * d), "out": _weight(2, d, d),
        "up": _weight(3, d, s.hidden), "down": _weight(4, s.hidden, d),
    }  # fmt: skip


def gpt_block(ops: Ops, p: dict[str, jax.Array], x: jax.Array, s: BlockShape) -> jax.Array:
    """Pre-LayerNorm, causal multi-head attention, GELU MLP; residuals around both."""
    b, t, d = x.shape
    h = ops.layer_norm(x, p["ln1_scale"], p["ln1_bias"])
    qkv = ops.matmul(h, p["qkv"]).reshape(b, t, 3, s.heads, d // s.heads)
    a = ops.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], True)
    x = x + ops.matmul(a.reshape(b, t, d), p["out"])
    h = ops.layer_norm(x, p["ln2_scale"], p["ln2_bias"])
    return x + ops.matmul(jax.nn.gelu(ops.matmul(h, p["up"])), p["down"])


def llama_params(s: BlockShape) -> dict[str, jax.Array]:
    d, kv = s.dim, 2 * s.kv_heads * (s.dim // s.heads)
    return {
        "norm1": jnp.ones((d,), jnp.bfloat16), "norm2": jnp.ones((d,), jnp.bfloat16),
        "q": _weight(1, d, d), "kv": _weight(2, d, kv), "out": _weight(3, d, d),
        "gate": _weight(4, d, s.hidden), "up": _weight(5, d, s.hidden),
        "down": _weight(6, s.hidden, d),
    }  # fmt: skip


def llama_block(ops: Ops, p: dict[str, jax.Array], x: jax.Array, s: BlockShape) -> jax.Array:
    """RMSNorm, causal grouped-query attention, SwiGLU MLP (no rotary embedding: it is
    the same elementwise work for every implementation)."""
    b, t, d = x.shape
    hd = d // s.heads
    h = ops.rms_norm(x, p["norm1"])
    q = ops.matmul(h, p["q"]).reshape(b, t, s.heads, hd)
    kv = ops.matmul(h, p["kv"]).reshape(b, t, 2, s.kv_heads, hd)
    a = ops.attention(q, kv[:, :, 0], kv[:, :, 1], True)
    x = x + ops.matmul(a.reshape(b, t, d), p["out"])
    h = ops.rms_norm(x, p["norm2"])
    return x + ops.matmul(ops.swiglu(h, p["gate"], p["up"]), p["down"])


BLOCKS = {"gpt": (gpt_block, gpt_params), "llama": (llama_block, llama_params)}


def train_step(block: str, ops: Ops, s: BlockShape) -> Callable[..., Any]:
    """`jit(value_and_grad(loss))(params, x)` for one block, the loss a plain sum."""
    fn = BLOCKS[block][0]

    def loss(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return fn(ops, p, x, s).astype(F32).sum()

    return jax.jit(jax.value_and_grad(loss))


def block_inputs(block: str, s: BlockShape) -> tuple[dict[str, jax.Array], jax.Array]:
    return BLOCKS[block][1](s), normal(0, (s.batch, s.seq, s.dim))
