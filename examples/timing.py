"""The step time the example scripts print."""

from __future__ import annotations

import statistics
import time

import jax


def step_time(step, *args, repeats: int = 10) -> float:
    """Median seconds of one call of `step(*args)` after a warm-up (wall clock; the
    call's outputs are waited for)."""
    jax.block_until_ready(step(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(step(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
