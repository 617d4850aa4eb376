"""kerneltune's ops against the plain JAX a CPU user has: forward and training step.

    python -m benchmarks.cpu_training_steps [--ops loss_head,layer_norm,...] [--rounds 4]
        [--dtypes float32,bfloat16] [--smoke]

For each op, dtype and pass (the forward; the gradient of the sum of squares of its
output, or of the loss, with respect to every float input), kerneltune through the
default executor (on a CPU: each op's heuristic) and the plain-JAX program a user would
write instead (`jax.nn.softmax`, `x @ w`, `jax.lax.ragged_dot`, a flax-style norm, the
materialised loss head), each compiled once. Rounds alternate the order of the two (a
program timed right after a large one runs slower), and each cell is the fastest of its
rounds' wall-clock times. `ratio` is kerneltune's time over plain JAX's (< 1: faster).
A difference within the spread of repeated runs is noise: run it twice.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt

#: (rows, features) of the row-wise ops and the matmuls' lhs; (experts,) of ragged_dot;
#: the loss head's vocabulary.
SHAPES = {"rows": 4096, "features": 1024, "experts": 8, "vocab": 8192}
SMOKE = {"rows": 64, "features": 32, "experts": 2, "vocab": 64}


def _normal(seed: int, shape: Sequence[int], dtype: Any) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def _layer_norm(x: jax.Array, s: jax.Array, b: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + 1e-6) * s + b).astype(x.dtype)


def _rms_norm(x: jax.Array, s: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.square(xf).mean(-1, keepdims=True) + 1e-6) * s).astype(x.dtype)


def rows(dtype: Any, sizes: dict[str, int]) -> dict[str, tuple[Callable, Callable, tuple]]:
    """Each op's (kerneltune, plain JAX, arguments) at `sizes`."""
    ops = kt.kernels
    m, d, g, v = sizes["rows"], sizes["features"], sizes["experts"], sizes["vocab"]
    x, scale, bias = _normal(0, (m, d), dtype), _normal(1, (d,), dtype), _normal(2, (d,), dtype)
    w, glu_w = _normal(3, (d, d), dtype), _normal(4, (d, 2, d // 2), dtype)
    experts, sizes_ = _normal(5, (g, d, d // 2), dtype), jnp.full((g,), m // g, jnp.int32)
    head_w = _normal(6, (d, v), dtype) * (d**-0.5)
    labels = jax.random.randint(jax.random.key(7), (m,), 0, v)

    def head(x: jax.Array, w: jax.Array) -> jax.Array:
        logits = (x @ w).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, labels[:, None], -1)[:, 0]
        return jnp.mean(jax.nn.logsumexp(logits, -1) - picked)

    return {
        "layer_norm": (ops.layer_norm, _layer_norm, (x, scale, bias)),
        "rms_norm": (ops.rms_norm, _rms_norm, (x, scale)),
        "softmax": (ops.softmax, jax.nn.softmax, (x,)),
        "matmul": (ops.matmul, jnp.matmul, (x, w)),
        "gated_linear_unit": (
            ops.gated_linear_unit,
            lambda x, w: jax.nn.silu(x @ w[:, 0]) * (x @ w[:, 1]),
            (x, glu_w),
        ),
        "ragged_dot": (
            lambda x, e: ops.ragged_dot(x, e, sizes_),
            lambda x, e: jax.lax.ragged_dot(x, e, sizes_),
            (x, experts),
        ),
        "loss_head": (
            lambda x, w: ops.linear_softmax_cross_entropy(x, labels, w),
            head,
            (x, head_w),
        ),
    }


def _training(fn: Callable, n: int) -> Callable:
    def loss(*args: Any) -> jax.Array:
        return jnp.sum(jnp.square(fn(*args).astype(jnp.float32)))

    return jax.grad(loss, argnums=tuple(range(n)))


def time_row(ours: Callable, plain: Callable, args: tuple, rounds: int) -> dict[str, float]:
    """The fastest wall-clock seconds of each (implementation, pass) over `rounds`
    rounds, the order of the implementations alternating."""
    programs = {}
    for name, fn in (("kerneltune", ours), ("plain", plain)):
        for pass_, f in (("fwd", fn), ("fwd+bwd", _training(fn, len(args)))):
            programs[(name, pass_)] = jax.jit(f).lower(*args).compile()
    best = {key: float("inf") for key in programs}
    for r in range(rounds):
        order = list(programs) if r % 2 == 0 else list(programs)[::-1]
        for key in order:
            jax.block_until_ready(programs[key](*args))
            start = time.perf_counter()
            jax.block_until_ready(programs[key](*args))
            best[key] = min(best[key], time.perf_counter() - start)
    return {f"{name} {pass_}": s for (name, pass_), s in best.items()}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one round")
    a = p.parse_args(argv)
    sizes, rounds = (SMOKE, 1) if a.smoke else (SHAPES, a.rounds)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; sizes {sizes}")
    print("| op | dtype | pass | kerneltune ms | plain JAX ms | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    out = []
    for dtype in a.dtypes.split(","):
        table = rows(jnp.dtype(dtype), sizes)
        for op in a.ops.split(",") if a.ops else list(table):
            ours, plain, args = table[op]
            times = time_row(ours, plain, args, rounds)
            for pass_ in ("fwd", "fwd+bwd"):
                k, j = times[f"kerneltune {pass_}"], times[f"plain {pass_}"]
                print(f"| {op} | {dtype} | {pass_} | {k * 1e3:.3f} | {j * 1e3:.3f} | {k / j:.2f} |")
                out.append(dict(op=op, dtype=dtype, pass_=pass_, kerneltune_s=k, plain_s=j))
    return out


if __name__ == "__main__":
    main()
