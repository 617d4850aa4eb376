"""Eager cache-hit cost of `executor(kernel, x)` against the same math as a plain
`jax.jit` call, and the ratio.

    python benchmarks/dispatch_overhead.py [--calls 20000] [--repeats 7]

The kernel and the plain function compute the same thing on the same small array, so
the difference is kerneltune's own per-call cost: finding the jitted program for the
call's signature. Medians over repeats; each repeat times `--calls` calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

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
    print(f"{'case':34s} {'µs/call':>9s} {'± spread':>9s} {'ratio':>7s}")
    for name, (median, spread) in results.items():
        print(f"{name:34s} {median:9.2f} {spread:9.2f} {median / base:7.2f}")


if __name__ == "__main__":
    main()
