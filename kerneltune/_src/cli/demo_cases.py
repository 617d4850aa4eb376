"""The rows of `kerneltune demo`: each bundled op at one shape, and what a user would
call instead.

Every row has four implementations of one computation: plain JAX (what `jax.nn`,
`jax.lax` and `jnp` give; attention through `jax.nn`'s cuDNN path on a GPU), tokamax's
op where tokamax has one, and kerneltune's public function, which the demo runs through
two executors (`demo_executors.py`). On a GPU the shapes are those BENCHMARKS.md
measured, so the demo's figures can be read against its tables; on a CPU they are tiny.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune import kernels as ktk
from kerneltune._src.cli import demo_moe
from kerneltune.kernels.ragged_dot.shapes import balanced

Fn = Callable[..., Any]
EPSILON = 1e-6
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: an op at one shape and pass.

    Attributes:
      name: the row's id (`kerneltune demo --ops NAME,...`).
      label: the op as the table shows it.
      shape: the problem, in the op's terms.
      pass_: "fwd", "fwd+bwd" (the gradients of a sum of the output) or "train step".
      args: `args(seed)`: the arguments every implementation takes.
      plain: plain JAX's implementation; `plain_name` says which.
      tokamax: `tokamax(module)`: tokamax's implementation, None where it has no such op.
      kerneltune: `kerneltune(executor)`: kerneltune's, through that executor.
    """

    name: str
    label: str
    shape: str
    pass_: str
    args: Callable[[int], tuple[Any, ...]]
    plain: Fn
    plain_name: str
    tokamax: Callable[[Any], Fn] | None
    kerneltune: Callable[[Any], Fn]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The shapes of one device class."""

    dtype: Any
    ragged_dot: tuple[int, int, int, int]  # rows, K, N, experts
    moe: demo_moe.MoEShape
    attention: tuple[int, int, int, int]  # B, T, heads, head dim (causal)
    window: tuple[int, int, int, int, int, int]  # B, T, heads, kv heads, head dim, window
    loss_head: tuple[int, int, int]  # tokens, K, vocabulary
    glu: tuple[int, int, int]  # tokens, K, N
    layer_norm: tuple[int, int]  # rows, width
    matmul: tuple[int, int, int]  # M, K, N
    softmax: tuple[int, int]  # rows, width


#: BENCHMARKS.md's shapes (see `demo_sample.py` for its figures at each).
GPU_SIZES = Sizes(
    dtype=jnp.bfloat16,
    # Mixtral's expert sizes at 8192 rows (4096 tokens, top-2): half the rows of the
    # earlier 16384 cut plain JAX's compile and the demo's wall by about 8 s on an H100
    # (BENCHMARKS.md, fortieth session), with the gain over tokamax kept (2.2-3.0x).
    ragged_dot=(8192, 4096, 14336, 8),
    moe=demo_moe.MoEShape(4096, 4096, 14336, 8, 2),
    attention=(4, 2048, 32, 64),
    window=(1, 16384, 16, 4, 128, 4096),
    loss_head=(16384, 2048, 128256),
    glu=(16384, 2048, 5632),
    layer_norm=(4096, 16384),
    matmul=(64, 8192, 8192),
    softmax=(4096, 32768),
)
#: Sizes the Pallas interpreter runs in moments.
CPU_SIZES = Sizes(
    dtype=jnp.float32,
    ragged_dot=(64, 32, 32, 4),
    moe=demo_moe.MoEShape(16, 32, 32, 4, 2),
    attention=(1, 64, 2, 32),
    window=(1, 64, 2, 1, 32, 16),
    loss_head=(64, 32, 256),
    glu=(64, 32, 64),
    layer_norm=(64, 256),
    matmul=(64, 128, 64),
    softmax=(64, 256),
)


def key(seed: Any) -> jax.Array:
    """A random key for the demo's inputs. XLA's own generator ("rbg") compiles in a
    third of the time of JAX's default threefry (XLA:CPU: 0.3 s against 0.7-0.9 s a
    program), and each row compiles its inputs' program on its first call."""
    return jax.random.key(seed, impl="rbg")


def normal(seed: int, shape: tuple[int, ...], dtype: Any, scale: float = 1.0) -> jax.Array:
    """Standard-normal data in `dtype` (random: all-zero inputs flatter some kernels)."""
    return (scale * jax.random.normal(key(seed), shape, F32)).astype(dtype)


def training(f: Fn, argnums: tuple[int, ...]) -> Fn:
    """The value and gradients (with respect to `argnums`) of the sum of `f`'s output."""
    return jax.value_and_grad(lambda *a: jnp.sum(f(*a).astype(F32)), argnums=argnums)


# --- plain JAX ---------------------------------------------------------------------------


def plain_attention(on_gpu: bool, **static: Any) -> Fn:
    """`jax.nn.dot_product_attention`: its cuDNN path on a GPU, XLA elsewhere."""
    implementation: Literal["cudnn"] | None = "cudnn" if on_gpu else None

    def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jax.nn.dot_product_attention(q, k, v, implementation=implementation, **static)

    return attention


def plain_loss(x: jax.Array, labels: jax.Array, w: jax.Array) -> jax.Array:
    """The faster form users write: logits in the inputs' dtype, upcast for the
    log-sum-exp (BENCHMARKS.md's baseline for the loss head)."""
    logits = jnp.dot(x, w).astype(F32)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def plain_glu(x: jax.Array, w: jax.Array) -> jax.Array:
    """Two dots over the fused `[K, 2, N]` weights' halves (BENCHMARKS.md's GLU rows)."""
    return jax.nn.silu(jnp.dot(x, w[:, 0])) * jnp.dot(x, w[:, 1])


def plain_layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """flax's LayerNorm math in float32."""
    xf = x.astype(F32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + EPSILON) * scale.astype(F32) + bias.astype(F32)
    return y.astype(x.dtype)


def tokamax_loss(tokamax: Any) -> Fn:
    def loss(x: jax.Array, labels: jax.Array, w: jax.Array) -> jax.Array:
        try:  # the implementation BENCHMARKS.md timed on GPUs (tokamax 0.0.17)
            return tokamax.linear_softmax_cross_entropy_loss(
                x, labels, w, reduction="mean", implementation="chunked_xla"
            )
        except ValueError:  # a tokamax that names it otherwise: its own choice
            return tokamax.linear_softmax_cross_entropy_loss(x, labels, w, reduction="mean")

    return loss


# --- the rows ----------------------------------------------------------------------------


def cases(on_gpu: bool) -> list[Case]:
    """Every row, in the order the demo runs them: the grouped matmul first, so that
    the first-call budget goes to the op where tuning matters most."""
    z = GPU_SIZES if on_gpu else CPU_SIZES
    dt = z.dtype
    out: list[Case] = []

    m, k, n, g = z.ragged_dot
    out.append(
        Case(
            "ragged_dot", "ragged_dot", f"{m}x{k}->{n} E{g} balanced", "fwd",
            lambda s: (
                normal(2 * s, (m, k), dt),
                normal(2 * s + 1, (g, k, n), dt),
                jnp.asarray(balanced(m, g)),
            ),
            jax.lax.ragged_dot, "jax.lax.ragged_dot",
            lambda tk: lambda a, b, sizes: tk.ragged_dot(a, b, sizes),
            lambda ex: lambda a, b, sizes: ktk.ragged_dot(a, b, sizes, executor=ex),
        )
    )  # fmt: skip

    s_moe = z.moe

    def moe_args(seed: int) -> tuple[Any, ...]:
        return (demo_moe.init_params(s_moe, dt, seed), *demo_moe.inputs(s_moe, dt, seed + 1))

    out.append(
        Case(
            "moe", "MoE layer", str(s_moe), "train step", moe_args,
            demo_moe.train_step(jax.lax.ragged_dot, s_moe), "jax.lax.ragged_dot",
            lambda tk: demo_moe.train_step(lambda a, b, s: tk.ragged_dot(a, b, s), s_moe),
            lambda ex: demo_moe.train_step(
                lambda a, b, s: ktk.ragged_dot(a, b, s, executor=ex), s_moe
            ),
        )
    )  # fmt: skip

    def qkv(b: int, t: int, heads: int, kv: int, d: int) -> Callable[[int], tuple[Any, ...]]:
        return lambda s: (
            normal(3 * s, (b, t, heads, d), dt),
            normal(3 * s + 1, (b, t, kv, d), dt),
            normal(3 * s + 2, (b, t, kv, d), dt),
        )

    def attention_case(name: str, label: str, shape: str, make: Any, **static: Any) -> Case:
        cudnn = "jax.nn (cuDNN)" if on_gpu else "jax.nn (XLA)"
        return Case(
            name, label, shape, "fwd+bwd", make,
            training(plain_attention(on_gpu, is_causal=True, **static), (0, 1, 2)), cudnn,
            lambda tk: training(
                lambda q, k, v: tk.dot_product_attention(q, k, v, is_causal=True, **static),
                (0, 1, 2),
            ),
            lambda ex: training(
                lambda q, k, v: ktk.attention(q, k, v, is_causal=True, executor=ex, **static),
                (0, 1, 2),
            ),
        )  # fmt: skip

    b, t, h, d = z.attention
    out.append(
        attention_case("attention", "attention", f"B{b} T{t} N{h} H{d} causal", qkv(b, t, h, h, d))
    )
    b, t, h, kv, d, w = z.window
    out.append(
        attention_case(
            "attention_window", "attention (window)", f"B{b} T{t} N{h}/{kv} H{d} window {w}",
            qkv(b, t, h, kv, d), local_window_size=(w, 0),
        )
    )  # fmt: skip

    rows, kk, vocab = z.loss_head
    out.append(
        Case(
            "loss_head", "loss head", f"{rows}x{kk}->{vocab}", "fwd+bwd",
            lambda s: (
                normal(3 * s, (rows, kk), dt),
                jax.random.randint(key(3 * s + 1), (rows,), 0, vocab, jnp.int32),
                normal(3 * s + 2, (kk, vocab), dt, kk**-0.5),
            ),
            jax.value_and_grad(plain_loss, argnums=(0, 2)), "jnp, logits in the inputs' dtype",
            lambda tk: jax.value_and_grad(tokamax_loss(tk), argnums=(0, 2)),
            lambda ex: jax.value_and_grad(
                lambda x, lb, w: ktk.linear_softmax_cross_entropy(x, lb, w, executor=ex),
                argnums=(0, 2),
            ),
        )
    )  # fmt: skip

    rows, kk, n = z.glu
    out.append(
        Case(
            "glu", "GLU (SwiGLU)", f"{rows}x{kk}->{n}", "fwd+bwd",
            lambda s: (normal(2 * s, (rows, kk), dt), normal(2 * s + 1, (kk, 2, n), dt, kk**-0.5)),
            training(plain_glu, (0, 1)), "jnp.dot x2",
            lambda tk: training(
                lambda x, w: tk.gated_linear_unit(x, w, activation=jax.nn.silu), (0, 1)
            ),
            lambda ex: training(
                lambda x, w: ktk.gated_linear_unit(x, w, activation=jax.nn.silu, executor=ex),
                (0, 1),
            ),
        )
    )  # fmt: skip

    rows, n = z.layer_norm
    out.append(
        Case(
            "layer_norm", "layer_norm", f"{rows}x{n}", "fwd",
            lambda s: (
                normal(3 * s, (rows, n), dt),
                normal(3 * s + 1, (n,), dt, 0.1) + 1,
                normal(3 * s + 2, (n,), dt, 0.1),
            ),
            plain_layer_norm, "jnp (XLA)",
            lambda tk: lambda x, sc, bi: tk.layer_norm(x, sc, bi, epsilon=EPSILON),
            lambda ex: lambda x, sc, bi: ktk.layer_norm(x, sc, bi, epsilon=EPSILON, executor=ex),
        )
    )  # fmt: skip

    mm, kk, n = z.matmul
    out.append(
        Case(
            "matmul", "matmul", f"{mm}x{kk}x{n}", "fwd",
            lambda s: (normal(2 * s, (mm, kk), dt), normal(2 * s + 1, (kk, n), dt)),
            jnp.dot, "jnp.dot", None,
            lambda ex: lambda a, b: ktk.matmul(a, b, executor=ex),
        )
    )  # fmt: skip

    rows, n = z.softmax
    out.append(
        Case(
            "softmax", "softmax", f"{rows}x{n}", "fwd",
            lambda s: (normal(s, (rows, n), dt),),
            lambda x: jax.nn.softmax(x, axis=-1), "jax.nn.softmax", None,
            lambda ex: lambda x: ktk.softmax(x, axis=-1, executor=ex),
        )
    )  # fmt: skip
    return out


def arg_bytes(args: tuple[Any, ...]) -> int:
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(args))
