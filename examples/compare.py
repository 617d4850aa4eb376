"""What both example scripts do: train the model a few steps with `jax.nn` ops and with
kerneltune's, and print each variant's losses, first call and steady step apart, then
the ratio of the steps.

kerneltune's first call chooses each kernel call's config as any program's does (the
persistent cache, the tables shipped for this GPU, else tuning within the first-call
budget: `examples/timing.py`). `--autotune` first runs `kt.autotune(step, ...)`, the
full search of every call in the step (kept only where the whole step gets faster),
and prints its wall apart; its configs are stored, so later runs start from them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
import kerneltune.kernels
from examples import jax_ops, timing

VARIANTS = (("jax.nn", jax_ops), ("kerneltune", kerneltune.kernels))
#: (batch, sequence) of the GPU-sized run, and of `--tiny`'s.
GPU_BATCH, TINY_BATCH = (8, 2048), (2, 16)


def batch(dim: int, dtype: str, batch_size: int, seq: int, seed: int = 0):
    """Random inputs and regression targets `[batch, seq, dim]`."""
    kx, ky = jax.random.split(jax.random.key(seed))
    shape = (batch_size, seq, dim)
    return (
        jax.random.normal(kx, shape).astype(jnp.dtype(dtype)),
        jax.random.normal(ky, shape).astype(jnp.dtype(dtype)),
    )


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {text!r}")
    return value


def main(
    argv: list[str] | None,
    description: str,
    make_step: Callable[[Any, ModuleType], tuple[Any, Any, Any]],
    configs: tuple[Any, Any],
) -> dict[str, float]:
    """`make_step(config, ops) -> (step, state, opt_state)`; `configs`: (full, tiny).
    Returns each variant's steady step time in seconds."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=positive, default=5)
    p.add_argument("--tiny", action="store_true", help="a tiny block (CPU, tests)")
    p.add_argument(
        "--autotune",
        action="store_true",
        help="tune every kerneltune call of the step fully (kt.autotune) before the first call",
    )
    args = p.parse_args(argv)
    config = configs[1] if args.tiny else configs[0]
    batch_size, seq = TINY_BATCH if args.tiny else GPU_BATCH
    runs: dict[str, timing.Run] = {}
    for name, ops in VARIANTS:
        step, state, opt_state = make_step(config, ops)
        x, y = batch(config.dim, config.dtype, batch_size, seq)
        if args.autotune and ops is kerneltune.kernels:
            t0 = time.perf_counter()
            result = kt.autotune(step, state, opt_state, x, y)
            # The result lists every kernel call, also those with nothing to tune here.
            tuned = sum(not entry.untuned for entry in result)
            print(
                f"{name:>10} kt.autotune(step): {tuned} of {len(result)} kernel calls tuned "
                f"in {time.perf_counter() - t0:.2f} s (before the first call, stored for "
                "later runs; the others have nothing to tune on this device)"
            )
        runs[name] = timing.train(step, (state, opt_state), (x, y), args.steps)
        timing.print_run(name, runs[name])
    timing.print_ratio("jax.nn", runs)
    return {name: run.step_s for name, run in runs.items()}
