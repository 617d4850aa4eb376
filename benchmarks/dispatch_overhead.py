"""Eager cache-hit cost of `executor(kernel, x)` against the same math as a plain
`jax.jit` call, and the ratio; then the public ops' eager calls against plain JAX's.

    python benchmarks/dispatch_overhead.py [--calls 20000] [--repeats 7]

The kernel and the plain function compute the same thing on the same small array, so
the difference is kerneltune's own per-call cost: finding the jitted program for the
call's signature. Medians over repeats; each repeat times `--calls` calls (the public
ops a twentieth of them). The public ops (`kerneltune.kernels.softmax`, ...) at tiny
shapes are timed beside the plain-JAX call a user would make instead (`jax.nn.softmax`,
...): their argument checks and the executor's lookup, against JAX's own dispatch.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
from kerneltune.kernels import Softmax


@dataclasses.dataclass(frozen=True)
class Cfg:
    block: int = 8


class Affine(kt.Kernel):
    op_id = "affine"

    def run(self, x, *, cfg, alpha=1.0):
        return jnp.sin(x) * alpha + 1.0

    def heuristic_cfg(self, inv):
        return Cfg()


def per_call_us(fn, calls: int, repeats: int) -> tuple[float, float]:
    for _ in range(1000):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples), (max(samples) - min(samples)) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per repeat")
    parser.add_argument(
        "--repeats", type=int, default=7, help="repeats; the median and spread are over them"
    )
    args = parser.parse_args()

    x = jax.random.normal(jax.random.PRNGKey(0), (128,), jnp.float32)
    kernel = Affine()
    executor = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )
    plain = jax.jit(lambda v: jnp.sin(v) * 2.0 + 1.0)
    jax.block_until_ready(plain(x))
    jax.block_until_ready(executor(kernel, x, alpha=2.0))

    # A bundled op (its backends declared as objects) on the same path.
    rows = jax.random.normal(jax.random.PRNGKey(1), (4, 32), jnp.float32)
    softmax = Softmax()
    cases = [
        ("plain jax.jit", lambda: plain(x)),
        ("executor(kernel, x, alpha=2.0)", lambda: executor(kernel, x, alpha=2.0)),
        ("executor(kernel, x)", lambda: executor(kernel, x)),
        ("executor(Softmax(), rows)", lambda: executor(softmax, rows)),
    ]
    jax.block_until_ready(executor(kernel, x))
    jax.block_until_ready(executor(softmax, rows))
    results = {name: per_call_us(fn, args.calls, args.repeats) for name, fn in cases}
    base = results["plain jax.jit"][0]
    print(f"device: {kt.device_fingerprint()}   jax {jax.__version__}   calls/repeat {args.calls}")
    print(f"{'case':36s} {'µs/call':>9s} {'± spread':>9s} {'ratio':>7s}")
    for name, (median, spread) in results.items():
        print(f"{name:36s} {median:9.2f} {spread:9.2f} {median / base:7.2f}")
    print()
    print(
        f"{'public op (eager)':36s} {'µs/call':>9s} {'± spread':>9s} {'plain µs':>9s} {'ratio':>7s}"
    )
    for name, ours, plain_fn in public_ops():
        jax.block_until_ready(ours())
        jax.block_until_ready(plain_fn())
        calls = max(args.calls // 20, 1)
        (median, spread), (plain_median, _) = (
            per_call_us(fn, calls, args.repeats) for fn in (ours, plain_fn)
        )
        print(
            f"{name:36s} {median:9.2f} {spread:9.2f} {plain_median:9.2f} "
            f"{median / plain_median:7.2f}"
        )


def public_ops() -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    """(name, kerneltune's call, plain JAX's call) at tiny float32 shapes."""
    from kerneltune.kernels import (
        attention,
        gated_linear_unit,
        layer_norm,
        linear_softmax_cross_entropy,
        matmul,
        ragged_dot,
        rms_norm,
    )
    from kerneltune.kernels import softmax as kt_softmax

    key = jax.random.split(jax.random.PRNGKey(2), 3)
    x = jax.random.normal(key[0], (8, 128), jnp.float32)
    w = jax.random.normal(key[1], (128, 128), jnp.float32)
    q = jax.random.normal(key[2], (1, 16, 2, 32), jnp.float32)
    labels = jnp.arange(8, dtype=jnp.int32)
    scale, bias = jnp.ones((128,), jnp.float32), jnp.zeros((128,), jnp.float32)
    w_glu = jax.random.normal(key[1], (128, 2, 64), jnp.float32)
    w_experts = jax.random.normal(key[1], (4, 128, 32), jnp.float32)
    x3 = x.reshape(2, 4, 128)
    sizes = jnp.array([2, 3, 0, 3], jnp.int32)

    def plain_norm(v):
        mean = v.mean(-1, keepdims=True)
        return (v - mean) * jax.lax.rsqrt(((v - mean) ** 2).mean(-1, keepdims=True) + 1e-6)

    def plain_loss(v, lab, weights):
        logits = v @ weights
        picked = jnp.take_along_axis(logits, lab[:, None], axis=-1)[:, 0]
        return (jax.nn.logsumexp(logits, axis=-1) - picked).mean()

    def plain_affine_norm(v, s, b):
        return plain_norm(v) * s + b

    def plain_rms(v, s):
        return v * jax.lax.rsqrt((v * v).mean(-1, keepdims=True) + 1e-6) * s

    def plain_glu(v, weights):
        return jax.nn.silu(v @ weights[:, 0]) * (v @ weights[:, 1])

    norm, loss = jax.jit(plain_norm), jax.jit(plain_loss)
    affine, rms, glu = jax.jit(plain_affine_norm), jax.jit(plain_rms), jax.jit(plain_glu)
    grouped = jax.jit(jax.lax.ragged_dot)
    return [
        ("softmax [8,128]", lambda: kt_softmax(x), lambda: jax.nn.softmax(x)),
        ("layer_norm [8,128]", lambda: layer_norm(x), lambda: norm(x)),
        (
            "layer_norm [8,128] scale, bias",
            lambda: layer_norm(x, scale, bias),
            lambda: affine(x, scale, bias),
        ),
        (
            "layer_norm [2,4,128] scale, bias",
            lambda: layer_norm(x3, scale, bias),
            lambda: affine(x3, scale, bias),
        ),
        ("rms_norm [8,128] scale", lambda: rms_norm(x, scale), lambda: rms(x, scale)),
        (
            "gated_linear_unit [8,128]x[128,2,64]",
            lambda: gated_linear_unit(x, w_glu),
            lambda: glu(x, w_glu),
        ),
        (
            "ragged_dot [8,128]x[4,128,32]",
            lambda: ragged_dot(x, w_experts, sizes),
            lambda: grouped(x, w_experts, sizes),
        ),
        ("matmul [8,128]x[128,128]", lambda: matmul(x, w), lambda: jnp.matmul(x, w)),
        ("matmul [2,4,128]x[128,128]", lambda: matmul(x3, w), lambda: jnp.matmul(x3, w)),
        (
            "attention causal [1,16,2,32]",
            lambda: attention(q, q, q, is_causal=True),
            lambda: jax.nn.dot_product_attention(q, q, q, is_causal=True),
        ),
        (
            "loss head [8,128]x[128,128]",
            lambda: linear_softmax_cross_entropy(x, labels, w),
            lambda: loss(x, labels, w),
        ),
    ]


if __name__ == "__main__":
    main()
