"""What the example scripts time and print: the first call apart from the steady step.

The first call of a jitted training step traces it, compiles it and runs it once. With
kerneltune's ops, tracing also picks each kernel call's config: from the persistent
cache, else from the tables shipped for this GPU, else by tuning it within the default
executor's first-call budget (the heuristic and 3 predicted configs timed, at most 5 s a
key and 20 s a process), the same first call a user's program makes. Every later step
runs the compiled program. Counting the first call with the steps hides both: the
scripts print it alone, then the steady step, then their ratio.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

#: What the first call does, per variant of the scripts.
FIRST_CALL = {
    "jax": "trace, compile, run",
    "jax.nn": "trace, compile, run",
    "kerneltune": "trace; each kernel call's config from the cache, the shipped tables or "
    "a tuning within the first-call budget; compile; run",
}


@dataclasses.dataclass(frozen=True)
class Run:
    """One variant's training run.

    Attributes:
      losses: the loss of each step.
      first_call_s: wall seconds of the first step (tracing, tuning, compiling, running).
      total_s: wall seconds of every step, the first included.
      step_s: the steady step: median wall seconds of one step after the run.
    """

    losses: list[float]
    first_call_s: float
    total_s: float
    step_s: float


def step_time(step: Callable[..., Any], *args: Any, repeats: int = 10) -> float:
    """Median seconds of one call of `step(*args)` after a warm-up (wall clock; the
    call's outputs are waited for)."""
    import jax

    jax.block_until_ready(step(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(step(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def train(step: Callable[..., Any], carry: Sequence[Any], extra: Sequence[Any], steps: int) -> Run:
    """Runs `steps` (>= 1) steps of `step(*carry, *extra) -> (*carry, loss)`, each
    waited for through its loss, then times the steady step."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}.")
    losses: list[float] = []
    first = 0.0
    t0 = time.perf_counter()
    for i in range(steps):
        *carry, loss = step(*carry, *extra)
        losses.append(float(loss))
        if i == 0:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return Run(losses, first, total, step_time(step, *carry, *extra))


def print_run(name: str, run: Run) -> None:
    """The run's losses, then its first call, steady step and total, on their lines."""
    print(f"{name:>10} losses: " + " ".join(f"{v:.6f}" for v in run.losses))
    print(f"{name:>10} first call: {run.first_call_s:.2f} s ({FIRST_CALL[name]})")
    print(f"{name:>10} steady step: {run.step_s * 1e3:.2f} ms")
    print(f"{name:>10} {len(run.losses)} steps, first call included: {run.total_s:.2f} s")


def print_ratio(baseline: str, runs: dict[str, Run]) -> None:
    """The steady steps' ratio, `baseline`'s over kerneltune's."""
    ratio = runs[baseline].step_s / runs["kerneltune"].step_s
    print(f"steady step, {baseline} ÷ kerneltune: {ratio:.2f}x (> 1: kerneltune's step is faster)")
