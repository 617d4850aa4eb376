"""How the demo measures one implementation of a row: its first call on the wall clock
(tracing, kerneltune's tuning where it tunes, compiling, running), the compiled
program's memory, then its time per call, in rounds interleaved with the row's other
implementations.

Times come from the tuner's own timers (`tuning/timing.py`): CUPTI device time on a
CUDA GPU, the wall clock elsewhere. Each figure is the median of the rounds; a round
takes one sample of every implementation, in an order rotated from round to round, so
that clock and thermal drift reach them alike.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from kerneltune._src.tuning.timing import (
    CuptiTimer,
    Timer,
    TimerFailed,
    calls_per_session,
    choose_timer,
)

#: Status of a measurement: timed, not offered ("n/a"), or why it did not run.
OK, NA, FAILED, OOM = "ok", "n/a", "failed", "oom"


@dataclasses.dataclass
class Measured:
    """One implementation of one row.

    Attributes:
      status: "ok", "n/a" (the implementation does not exist here), "failed" or "oom".
      time_s: median seconds per call (None unless timed).
      first_call_s: wall seconds of the first call (None unless it ran).
      peak_bytes: the compiled program's arguments + outputs + temporaries
        (`memory_analysis`), None where XLA does not say.
      note: why it is "n/a", or the error (one line).
      program_of: the implementation whose compiled program this one ran, where
        `first_call` found it already built ("" where it compiled its own).
    """

    status: str
    time_s: float | None = None
    first_call_s: float | None = None
    peak_bytes: int | None = None
    note: str = ""
    program_of: str = ""


@dataclasses.dataclass(frozen=True)
class Rounds:
    """How much timing: `rounds` interleaved rounds, each sample about `sample_s` of
    calls (between 1 and `max_calls` of them)."""

    rounds: int
    sample_s: float
    max_calls: int


#: On a GPU: enough rounds for a stable median; the whole demo stays near a minute.
#: Samples of about 10 ms (a 220 us kernel: 45 calls) and at most 50 calls: the short
#: rows' timing took 2-3 s a row with 20 ms and 100 calls.
GPU_ROUNDS = Rounds(rounds=5, sample_s=0.01, max_calls=50)
#: On a CPU the figures mean nothing: as few calls as show the path works.
CPU_ROUNDS = Rounds(rounds=2, sample_s=0.0, max_calls=1)


def error_line(e: BaseException) -> str:
    """`Type: first line of the message` (at most 160 characters)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:160] if lines else ''}"


def status_of(error: str) -> str:
    """ "oom" for an error that says the device ran out of memory, else "failed"."""
    return OOM if "RESOURCE_EXHAUSTED" in error or "out of memory" in error.lower() else FAILED


def failure(e: BaseException) -> Measured:
    text = error_line(e)
    return Measured(status_of(text), note=text)


def program_peak(compiled: Any) -> int | None:
    """Arguments + outputs + temporaries of a compiled program, or None."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # a platform that does not analyse memory
        return None
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)


def leaves(args: Sequence[Any]) -> list[Any]:
    """The arrays of `args` (pytrees of them), flat: what `first_call`'s programs take."""
    return list(jax.tree.leaves(tuple(args)))


@dataclasses.dataclass(frozen=True)
class Built:
    """A program one implementation of a row compiled: the executable, the wall of
    compiling it and running it once, and whose it is."""

    compiled: Any
    compile_run_s: float
    impl: str


def first_call(
    fn: Callable[..., Any],
    args: Sequence[Any],
    built: dict[str, Built] | None = None,
    impl: str = "",
) -> tuple[Any, Measured]:
    """Lowers (traces, and so tunes kerneltune's calls), compiles and runs `fn` once on
    `args`, on the wall clock. Returns the compiled program, which takes `leaves(args)`
    (flat arrays, as the tuner's timed programs do), or None when it failed; and the
    measurement so far.

    `built` (the row's programs so far, by their lowered text) is where a program
    another implementation of the row already compiled is found: kerneltune untuned
    and as chosen lower to the same program where tuning kept the heuristic's configs.
    That program is not compiled again: this first call is its own lowering plus the
    other's compile and first run, what it costs alone, and its `program_of` names the
    other. `impl` names this implementation in `built`."""
    flat, tree = jax.tree.flatten(tuple(args))

    def on_leaves(*arrays: Any) -> Any:
        return fn(*jax.tree.unflatten(tree, arrays))

    t0 = time.perf_counter()
    try:
        lowered = jax.jit(on_leaves).lower(*flat)
        text = lowered.as_text() if built is not None else ""
        same = built.get(text) if built is not None else None
        if same is not None:
            wall = time.perf_counter() - t0 + same.compile_run_s
            peak = program_peak(same.compiled)
            return same.compiled, Measured(
                OK, first_call_s=wall, peak_bytes=peak, program_of=same.impl
            )
        t1 = time.perf_counter()
        compiled = lowered.compile()
        jax.block_until_ready(compiled(*flat))
    except Exception as e:  # one implementation failing must not end the demo
        return None, failure(e)
    done = time.perf_counter()
    if built is not None:
        built[text] = Built(compiled, done - t1, impl)
    return compiled, Measured(OK, first_call_s=done - t0, peak_bytes=program_peak(compiled))


def shared_with(m: Measured) -> str | None:
    """The implementation whose compiled program `m` ran (`first_call`), or None."""
    return m.program_of if m.status == OK and m.program_of else None


def _calls(
    timer: Timer, fn: Any, sets: Sequence[Sequence[Any]], plan: Rounds
) -> tuple[int, float | None]:
    """Calls per sample: about `plan.sample_s` of them, from one call timed on the
    first argument set, no more than one CUPTI session holds. Returns the count and, when it is one call, that call's time:
    it is the first round's sample, so a long call is not run once more for nothing."""
    if plan.max_calls <= 1:
        return 1, None
    one = timer.sample(fn, sets, 1, 0)
    calls = max(1, min(plan.max_calls, round(plan.sample_s / max(one, 1e-7))))
    if timer.name == CuptiTimer.name:
        # A CUPTI session keeps every call's outputs, so a sample of large outputs ran
        # as many sessions, each with a fixed cost of its own: the layer norm row's 33
        # calls were 17 sessions a sample and 1.5 s of timing on an H200. Device time
        # needs no long sample; one session is one.
        calls = calls_per_session(fn, calls)
    return calls, one if calls == 1 else None


def interleaved(
    programs: dict[str, Any], sets: Sequence[Sequence[Any]], plan: Rounds
) -> tuple[dict[str, float], dict[str, str], str]:
    """Median seconds per call of each compiled program over `plan.rounds` rounds,
    every program sampled once a round on the argument sets in turn. Returns the times,
    the errors of programs that failed while timed, and the timer's name."""
    timer, _ = choose_timer("auto")
    try:
        return _interleaved(timer, programs, sets, plan)
    except TimerFailed:
        timer, _ = choose_timer("wallclock")
        return _interleaved(timer, programs, sets, plan)
    finally:
        close = getattr(timer, "close", None)
        if close is not None:
            close()


def _interleaved(
    timer: Timer, programs: dict[str, Any], sets: Sequence[Sequence[Any]], plan: Rounds
) -> tuple[dict[str, float], dict[str, str], str]:
    samples: dict[str, list[float]] = {name: [] for name in programs}
    errors: dict[str, str] = {}
    if not programs:
        return {}, errors, timer.name
    calls: dict[str, int] = {}
    names = list(programs)
    for r in range(plan.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name in errors:
                continue
            try:
                if name not in calls:
                    calls[name], first = _calls(timer, programs[name], sets, plan)
                    if first is not None and r == 0:  # timed on set 0, as round 0 is
                        samples[name].append(first)
                        continue
                samples[name].append(timer.sample(programs[name], sets, calls[name], r))
            except TimerFailed:
                raise
            except Exception as e:  # out of memory while timed, for one
                errors[name] = error_line(e)
    times = {name: statistics.median(v) for name, v in samples.items() if v and name not in errors}
    return times, errors, timer.name
