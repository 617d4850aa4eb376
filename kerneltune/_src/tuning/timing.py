"""Timers: how long one call of a compiled function takes on the device.

Two timers sit behind one small `Timer` protocol:

- `CuptiTimer` reads the kernels' device time through CUPTI
  (`jax.experimental.mosaic.gpu.profiler.measure`): no dispatch overhead, no host
  jitter. GPU only.
- `WallClockTimer` runs many calls per sample and divides the host time by their
  number, so the dispatch cost is amortised. Works everywhere; the fallback.

CUPTI allows one subscriber per process. Where the JAX profiler ran (or runs, or a tool
such as Nsight is attached), CUPTI has aborted the process ("activity records were
dropped"): `choose_timer` then falls back to the wall clock and says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from kerneltune._src.core import jax_compat
from kerneltune._src.tuning import stages

logger = logging.getLogger("kerneltune")

#: Held by device work for a measurement (samples, first runs, the session detaching
#: CUPTI): CUPTI takes one subscriber, so sessions on two threads must never overlap.
DEVICE_LOCK = threading.Lock()

#: Whether the default CUPTI timer keeps CUPTI attached between samples: a session cost
#: 14 ms of host time detaching after each, 1.7 ms not (H200, jax 0.11.2).
CUPTI_KEEP_ATTACHED = True

#: The most output bytes one CUPTI session may hold: the profiler keeps every call's
#: outputs until its session ends (tuning a 75 MB layer norm on an H100 raised the
#: peak by 1.5 GiB). Longer samples run several sessions.
MAX_SESSION_OUTPUT_BYTES = 256 << 20

#: Environment variables that mean another CUPTI client is injected into the process.
_CUPTI_INJECTION_VARIABLES = ("CUDA_INJECTION64_PATH", "NSYS_PROFILING_SESSION_ID")


class TimerFailed(RuntimeError):
    """The timer itself failed (not the function it timed); the tuner switches to the
    fallback timer and measures again."""


@runtime_checkable
class Timer(Protocol):
    """Times calls of a compiled function.

    `sample(fn, arg_sets, calls, start)` makes `calls` calls of `fn`, cycling through
    `arg_sets` from index `start` (distinct buffers, so small kernels are not timed out
    of a warm cache), and returns the mean seconds per call. It raises `TimerFailed`
    when the timer (not `fn`) fails; errors raised by `fn` propagate unchanged.
    """

    name: str

    def sample(
        self, fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], calls: int, start: int
    ) -> float: ...


class WallClockTimer:
    """Host wall time over `calls` back-to-back calls, synchronised once at the end."""

    name = "wallclock"

    def sample(
        self, fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], calls: int, start: int
    ) -> float:
        n = len(arg_sets)
        out = None
        t0 = time.perf_counter()
        for i in range(calls):
            out = fn(*arg_sets[(start + i) % n])
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / calls


class CuptiTimer:
    """Device time of every kernel a call launches, summed, through CUPTI.

    Each sample is one `profiler.measure` session over `calls` calls on one argument
    set (the session API takes one set of arguments), starting at a different set for
    each sample. `fn` should be a `jax.stages.Compiled` (anything else is jitted by
    `measure`).
    """

    name = "cupti"

    def __init__(self, *, keep_attached: bool = False) -> None:
        self._measure = _measure_api()
        if self._measure is None:
            raise TimerFailed("jax.experimental.mosaic.gpu.profiler.measure is unavailable")
        # Detaching CUPTI after every session (what `measure` does) has a cost; the
        # profiler's `Cupti(finalize=False)` keeps it attached until `close()`.
        self._session = _attached_session() if keep_attached else None
        self._last: tuple[Callable[..., Any], Sequence[Any]] | None = None

    def sample(
        self, fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], calls: int, start: int
    ) -> float:
        measure, takes_iterations, extra = self._measure  # type: ignore[misc]
        if self._session is not None:
            measure, takes_iterations, extra = self._session, True, {}
        args = arg_sets[start % len(arg_sets)]
        self._last = (fn, args)
        try:
            if takes_iterations:
                per_call_ms = []
                per_session = calls_per_session(fn, calls)
                for done in range(0, calls, per_session):
                    n = min(per_session, calls - done)
                    timings = _session(measure, fn, args, iterations=n, **extra)
                    per_call_ms += _timings_ms(timings)
            else:
                per_call_ms = []
                for _ in range(calls):
                    per_call_ms += _timings_ms(_session(measure, fn, args, **extra))
        except Exception as e:
            # The function's own failures (e.g. out of memory) propagate; only failures
            # of the measurement machinery mean "use another timer".
            if not _looks_like_timer_error(e):
                raise
            raise TimerFailed(f"CUPTI measurement failed: {type(e).__name__}: {e}") from e
        if not per_call_ms:
            raise TimerFailed("CUPTI recorded no kernel for this function")
        return sum(per_call_ms) / len(per_call_ms) / 1e3

    def close(self) -> None:
        """Detaches CUPTI when sessions kept it attached."""
        if self._session is None or self._last is None:
            return
        fn, args = self._last
        self._last = None
        try:
            measure, _, extra = self._measure  # type: ignore[misc]
            # A plain session detaches at its end; overlapping another thread's
            # session, it failed ("another subscriber ... is active", on an H200).
            with DEVICE_LOCK:
                measure(fn, **extra)(*args)
        except Exception as e:
            logger.debug("detaching CUPTI failed: %s", e)


#: A CUPTI session counts every kernel the process launches, so XLA's autotuning in a
#: compile on another thread spoils it (a launch count not divisible by the calls, or
#: names that differ). It runs again, this many times at most, with the other threads'
#: stages paused (`stages.others_paused`; `FOREIGN_LAUNCH_QUIET_S` at most for those
#: under way): retries after short sleeps were not enough on an H200 (BENCHMARKS.md).
FOREIGN_LAUNCH_RETRIES = 3
FOREIGN_LAUNCH_QUIET_S = 30.0


def _foreign_launches(e: BaseException) -> bool:
    """Whether the profiler's error says the session counted launches not its own."""
    text = str(e)
    return "not divisible by the number of iterations" in text or (
        "not consistent across iterations" in text
    )


def _session(measure: Callable[..., Any], fn: Any, args: Sequence[Any], **kwargs: Any) -> Any:
    """One CUPTI session's timings; one that counted launches not its own runs again
    (`FOREIGN_LAUNCH_RETRIES` times at most), all retries under one pause."""
    retry = 0
    with contextlib.ExitStack() as pause:
        while True:
            try:
                return measure(fn, **kwargs)(*args)[1]
            except RuntimeError as e:
                if retry == FOREIGN_LAUNCH_RETRIES or not _foreign_launches(e):
                    raise
                logger.debug("CUPTI session %d counted other launches (%s)", retry, e)
            if retry == 0:  # one pause for all retries: no compile slips in between
                pause.enter_context(stages.others_paused(FOREIGN_LAUNCH_QUIET_S))
            retry += 1


def output_bytes(fn: Any) -> int | None:
    """The bytes of one call's outputs where `fn` says (a compiled program's
    `out_info`), else None."""
    info = getattr(fn, "out_info", None)
    if info is None:
        return None
    total = 0
    for leaf in jax.tree_util.tree_leaves(info):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            return None
        total += math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
    return total


def calls_per_session(fn: Any, calls: int) -> int:
    """How many of `calls` one CUPTI session may make: as many as keep their outputs
    within `MAX_SESSION_OUTPUT_BYTES` (at least one)."""
    size = output_bytes(fn)
    if not size:
        return max(1, calls)
    return max(1, min(calls, MAX_SESSION_OUTPUT_BYTES // size))


def _attached_session() -> Callable[..., Any] | None:
    try:
        from jax.experimental.mosaic.gpu import profiler

        cls = profiler.Cupti
        if "finalize" not in {f.name for f in dataclasses.fields(cls)}:
            return None
        session = cls(finalize=False)
        return session.measure
    except Exception:
        return None


def _looks_like_timer_error(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return any(
        word in text
        for word in ("cupti", "kernel launches", "kernel names", "not supported on this platform")
    )


@functools.cache
def _measure_api() -> tuple[Callable[..., Any], bool, dict[str, Any]] | None:
    """`profiler.measure`, whether it takes `iterations=`, and the keyword arguments
    that select CUPTI (older releases had a `mode=` argument)."""
    try:
        from jax.experimental.mosaic.gpu import profiler
    except Exception as e:  # no Mosaic GPU in this jaxlib.
        logger.debug("CUPTI timer unavailable: %s", e)
        return None
    measure = getattr(profiler, "measure", None)
    if measure is None:
        return None
    try:
        params = inspect.signature(measure).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    extra: dict[str, Any] = {}
    if "mode" in params:
        extra["mode"] = "cupti"
    if "aggregate" in params:
        extra["aggregate"] = True
    return measure, "iterations" in params, extra


def _timings_ms(timings: Any) -> list[float]:
    """Per-call milliseconds from whatever `measure` returned: None, a float, a list of
    floats (one per iteration), a list of (kernel, ms) pairs, or a list of such lists."""
    if timings is None:
        return []
    if isinstance(timings, (int, float)):
        return [float(timings)]
    out = []
    items = list(timings)
    if items and isinstance(items[0], tuple) and len(items[0]) == 2:
        return [float(sum(ms for _, ms in items))]
    for item in items:
        if isinstance(item, (int, float)):
            out.append(float(item))
        else:
            out.append(float(sum(ms for _, ms in item)))
    return out


# --- when CUPTI must not be used -------------------------------------------------------

_profiler_seen = threading.Event()
_cupti_broken: list[str] = []


def note_profiler_used() -> None:
    """Records that the JAX profiler (or another CUPTI client) ran in this process, so
    later tunings use the wall-clock timer. Called by the observer installed on
    `jax.profiler.start_trace`; call it yourself if you profile by other means."""
    _profiler_seen.set()


def profiler_conflict() -> str | None:
    """Why CUPTI must not be used in this process now, or None when it may be."""
    if jax_compat.profiler_trace_active():
        _profiler_seen.set()
        return "a JAX profiler trace is active"
    if jax_compat.profiler_server_running():
        _profiler_seen.set()
        return "a JAX profiler server is running"
    if _profiler_seen.is_set():
        return "the JAX profiler was used earlier in this process"
    for var in _CUPTI_INJECTION_VARIABLES:
        if os.environ.get(var):
            return f"another CUPTI client is attached ({var} is set)"
    if _cupti_broken:
        return _cupti_broken[0]
    return None


def mark_cupti_broken(reason: str) -> None:
    """Stops using CUPTI in this process after it failed once."""
    if not _cupti_broken:
        _cupti_broken.append(reason)


def install_profiler_observer() -> None:
    """Wraps every way JAX starts a profiler trace or server (`start_trace`,
    `start_server` and, on JAX 0.12, `ProfileSession.start`, which `jax.profiler.trace`
    uses) so that their use is remembered: a trace that was started and stopped leaves
    no other trace in JAX's state, yet CUPTI measurements after it can abort the
    process.

    Called when the first `Tuner` is built, never on import. A trace that ended before
    that is not seen: call `note_profiler_used()` after it. Where JAX's private layout
    is unknown, nothing can be wrapped: a warning says so once."""
    global _observer_unavailable_warned
    try:
        import jax.profiler as public
    except Exception:
        return
    points = jax_compat.profiler_entry_points()
    if not points and not _observer_unavailable_warned:
        _observer_unavailable_warned = True
        warnings.warn(
            f"kerneltune cannot observe the JAX profiler on jax {jax.__version__} (its "
            "private layout moved): a trace that starts and stops before tuning is not "
            "seen, and CUPTI may then run beside it. When you profile, tune with "
            "Tuner(timer='wallclock').",
            RuntimeWarning,
            stacklevel=2,
        )
    for owner, name in points:
        original = getattr(owner, name)
        if getattr(original, "_kerneltune_observed", False):
            continue

        def observed(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            note_profiler_used()
            return __original(*args, **kwargs)

        functools.update_wrapper(observed, original)
        observed._kerneltune_observed = True  # type: ignore[attr-defined]
        setattr(owner, name, observed)
        if getattr(public, name, None) is original:
            setattr(public, name, observed)


_observer_unavailable_warned = False


# --- choosing ------------------------------------------------------------------------


def default_platform() -> str:
    return jax.devices()[0].platform.lower()


def choose_timer(preference: str | Timer = "auto") -> tuple[Timer, str | None]:
    """The timer to use and, when it is not the preferred one, why.

    Args:
      preference: "auto" (CUPTI on a CUDA GPU when it is safe, else the wall clock),
        "cupti", "wallclock", or a `Timer` instance (used as is).

    Raises:
      ValueError: `preference` is not one of those.
    """
    if isinstance(preference, Timer) and not isinstance(preference, str):
        return preference, None
    if preference not in ("auto", "cupti", "wallclock"):
        raise ValueError(
            f"timer must be 'auto', 'cupti', 'wallclock' or a Timer instance, got {preference!r}."
        )
    if preference == "wallclock":
        return WallClockTimer(), None
    platform = default_platform()
    if platform not in ("gpu", "cuda"):
        note = None if preference == "auto" else f"CUPTI needs a CUDA GPU, not {platform}"
        return WallClockTimer(), note
    conflict = profiler_conflict()
    if conflict is not None:
        return WallClockTimer(), f"CUPTI not used: {conflict}"
    try:
        return CuptiTimer(keep_attached=CUPTI_KEEP_ATTACHED), None
    except TimerFailed as e:
        return WallClockTimer(), f"CUPTI not used: {e}"
