"""Trains the mixture-of-experts block a few steps with `jax.lax.ragged_dot` and with
kerneltune's `ragged_dot`, and prints each run's losses, first call and steady step
apart, then the ratio of the steps.

    python -m examples.moe.train [--steps N] [--tiny]

The first call traces, compiles and runs the step once; with kerneltune it also picks
each grouped matmul's config (forward and backward): from the persistent cache, else
the tables shipped for this GPU, else tuned within the default executor's first-call
budget (the heuristic and 3 predicted configs timed, at most 5 s a key and 20 s in
all). Later steps run the compiled program. On a CPU (or with `--tiny`) the block is
tiny and kerneltune runs `jax.lax.ragged_dot` (its CPU path), so the two runs' losses
agree; on a GPU the same code runs the Pallas kernels. `benchmarks/ragged_dot_gpu.py`
times the block at real sizes.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from examples import timing
from examples.compare import positive
from examples.moe import model


def run(ops, s: model.MoEShape, steps: int, dtype) -> timing.Run:
    params = model.init_params(s, dtype)
    x, target = model.inputs(s, dtype)
    step = jax.jit(model.train_step(ops, s))
    return timing.train(step, (params,), (x, target), steps)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Returns each variant's steady step time in seconds."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=positive, default=5)
    parser.add_argument("--tiny", action="store_true", help="the tiny block (default off GPUs)")
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    s = model.TINY if args.tiny or not on_gpu else model.GPU_SHAPES[0]
    dtype = jnp.bfloat16 if on_gpu and not args.tiny else jnp.float32
    runs = {}
    for ops in (model.jax_ops(), model.kerneltune_ops()):
        runs[ops.name] = run(ops, s, args.steps, dtype)
        timing.print_run(ops.name, runs[ops.name])
    timing.print_ratio("jax", runs)
    return {name: r.step_s for name, r in runs.items()}


if __name__ == "__main__":
    main()
