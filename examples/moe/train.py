"""Trains the mixture-of-experts block a few steps with `jax.lax.ragged_dot` and with
kerneltune's `ragged_dot`, and prints both runs' losses and times.

    python -m examples.moe.train [--steps N] [--tiny]

On a CPU (or with `--tiny`) the block is tiny and kerneltune runs `jax.lax.ragged_dot`
(its CPU path), so the two runs' losses agree; on a GPU the same code runs the tuned
kernels. `benchmarks/ragged_dot_gpu.py` times the block at real sizes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from examples.moe import model


def run(ops, s: model.MoEShape, steps: int, dtype) -> tuple[list[float], float]:
    params = model.init_params(s, dtype)
    x, target = model.inputs(s, dtype)
    step = jax.jit(model.train_step(ops, s))
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        params, loss = step(params, x, target)
        losses.append(float(loss))
    return losses, time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the tiny block (default off GPUs)")
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    s = model.TINY if args.tiny or not on_gpu else model.GPU_SHAPES[0]
    dtype = jnp.bfloat16 if on_gpu and not args.tiny else jnp.float32
    times = {}
    for ops in (model.jax_ops(), model.kerneltune_ops()):
        losses, seconds = run(ops, s, args.steps, dtype)
        times[ops.name] = seconds
        print(f"{ops.name:>10} losses: {' '.join(f'{v:.6f}' for v in losses)}  ({seconds:.2f} s)")
    return times


if __name__ == "__main__":
    main()
