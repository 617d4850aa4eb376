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
    run = _BoundedRun(run_all)
    del run_all  # the thread must hold the last reference: it frees it inside its stage
    threading.Thread(target=run, name="kerneltune-run", daemon=True).start()
    return run.outcome(bound_s)


class _BoundedRun:
    """`fn()` on a daemon thread, counted as a running stage until the thread holds no
    reference to `fn` nor to what it returned: what they hold (a compiled program,
    device arrays) must be freed before interpreter exit stops waiting, or freeing it
    races finalisation (SIGABRT)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn: Callable[[], Any] | None = fn
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._given_up = False
        self._result: Any = None
        self._error: BaseException | None = None

    def __call__(self) -> None:
        with exit_waits_for_this():  # exiting mid-run would abort the interpreter
            assert self._fn is not None
            try:
                result, error = self._fn(), None
            except BaseException as e:  # handed to the waiting thread
                result, error = None, e
            finally:
                self._fn = None
            with self._lock:
                if not self._given_up:
                    self._result, self._error = result, error
                self._done.set()
            del result, error

    def outcome(self, bound_s: float) -> Any:
        """What `fn` returned (or raises what it raised), or `(ABANDONED, [])` when it
        did not return within `bound_s`: it goes on in its thread, and nothing waits."""
        self._done.wait(bound_s)
        with self._lock:  # it may have finished since the wait timed out
            if not self._done.is_set():
                self._given_up = True
                return ABANDONED, []
            result, error, self._result, self._error = self._result, self._error, None, None
        if error is not None:
            raise error
        return result
