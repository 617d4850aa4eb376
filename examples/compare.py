"""What both example scripts do: train the model a few steps with `jax.nn` ops and with
kerneltune's, tune the kerneltune one with one call first, print losses and step times."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
import kerneltune.kernels
from examples import jax_ops
from examples.timing import step_time

VARIANTS = (("jax.nn", jax_ops), ("kerneltune", kerneltune.kernels))


def batch(dim: int, dtype: str, batch_size: int, seq: int, seed: int = 0):
    """Random inputs and regression targets `[batch, seq, dim]`."""
    kx, ky = jax.random.split(jax.random.key(seed))
    shape = (batch_size, seq, dim)
    return (
        jax.random.normal(kx, shape).astype(jnp.dtype(dtype)),
        jax.random.normal(ky, shape).astype(jnp.dtype(dtype)),
    )


def main(
    argv: list[str] | None,
    description: str,
    make_step: Callable[[Any, ModuleType], tuple[Any, Any, Any]],
    configs: tuple[Any, Any],
) -> dict[str, float]:
    """`make_step(config, ops) -> (step, state, opt_state)`; `configs`: (full, tiny).
    Returns each variant's step time in seconds."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a tiny block (CPU, tests)")
    args = p.parse_args(argv)
    config = configs[1] if args.tiny else configs[0]
    batch_size, seq = (2, 16) if args.tiny else (8, 2048)
    times = {}
    for name, ops in VARIANTS:
        step, state, opt_state = make_step(config, ops)
        x, y = batch(config.dim, config.dtype, batch_size, seq)
        if ops is kerneltune.kernels:
            result = kt.autotune(step, state, opt_state, x, y)  # one call tunes it all
            print(f"kerneltune tuned {len(result)} kernel calls")
        losses = []
        for _ in range(args.steps):
            state, opt_state, loss = step(state, opt_state, x, y)
            losses.append(float(loss))
        print(f"{name:10s} losses: " + " ".join(f"{v:.5f}" for v in losses))
        times[name] = step_time(step, state, opt_state, x, y)
        print(f"{name:10s} step: {times[name] * 1e3:.2f} ms")
    return times
