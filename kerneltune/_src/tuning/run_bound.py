"""A candidate's first runs (its warm-up), within a bound: a run past it is abandoned.

In process, an abandoned run cannot be stopped: it goes on in its daemon thread (and
interpreter exit waits for it, as for an abandoned compile). In an isolated worker
(`kerneltune tune --isolate`) the parent process enforces the bound instead: it can kill
a hang, and a worker must not go on with a device that a hung kernel still occupies.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from kerneltune._src.tuning import journal
from kerneltune._src.tuning.stages import exit_waits_for_this

#: A first run longer than this is abandoned (status "timeout"), unless the tuner
#: names its own bound: `RUN_BOUND_OVER_HEURISTIC` times the heuristic config's first
#: run, at least `MIN_RUN_BOUND_S`; `DEFAULT_RUN_BOUND_S` before the heuristic ran.
DEFAULT_RUN_BOUND_S = 60.0
RUN_BOUND_OVER_HEURISTIC, MIN_RUN_BOUND_S = 100.0, 10.0

#: What `warm_up` returns for a first run it abandoned.
ABANDONED = object()


def bound_s(heuristic_first_run_s: float | None) -> float:
    """The default bound, from the heuristic config's first run when it ran."""
    if heuristic_first_run_s is None:
        return DEFAULT_RUN_BOUND_S
    return max(MIN_RUN_BOUND_S, RUN_BOUND_OVER_HEURISTIC * heuristic_first_run_s)


def warm_up(
    compiled: Callable[..., Any], arg_sets: list[list[Any]], runs: int, bound_s: float
) -> tuple[Any, list[float]]:
    """`runs` runs of `compiled`, cycling through `arg_sets`: the first one's output and
    every run's seconds, or `(ABANDONED, [])` when they overran `bound_s`."""

    def run_all() -> tuple[Any, list[float]]:
        times, out = [], None
        for i in range(runs):
            t0 = time.perf_counter()
            result = compiled(*arg_sets[i % len(arg_sets)])
            jax.block_until_ready(result)
            times.append(time.perf_counter() - t0)
            if i == 0:
                out = result
        return out, times

    if journal.enabled() or math.isinf(bound_s):
        return run_all()
    done = threading.Event()
    box: dict[str, Any] = {}

    def run_in_thread() -> None:
        with exit_waits_for_this():  # exiting mid-run would abort the interpreter
            try:
                box["result"] = run_all()
            except BaseException as e:  # handed to the waiting thread
                box["error"] = e
            finally:
                done.set()

    threading.Thread(target=run_in_thread, name="kerneltune-run", daemon=True).start()
    if not done.wait(bound_s):
        return ABANDONED, []  # it goes on in its thread; nothing waits for it
    if "error" in box:
        raise box["error"]
    return box["result"]
