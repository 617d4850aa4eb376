"""The bench: compiles, validates and times candidates for one tuning.

A search strategy hands the bench candidates (`evaluate`, or `submit` and `wait` for
a search that proposes the next candidates as soon as any result lands). The bench
builds them on the compile pool (`compiling.py`: one lowering thread feeding the compile
threads, the slowest to compile first), runs each once as soon as it is compiled (a
warm-up whose output is validated against the reference config's output), and times
them.

Timing is an event loop on the calling thread: between compile results it takes one
sample of the compiled candidate with the fewest samples (ties in random order), so the
candidates are visited in interleaved rounds and slow drifts (clocks, temperature, other
load) spread over all of them instead of biasing the ones timed last. A device timer is
not disturbed by compiles running on the host, so with one the device is kept busy
while the rest still compile; a host timer (the wall clock) waits until no compile is
running. A candidate whose fastest sample is already `drop_factor` times the best median
gets no more samples.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kerneltune._src.tuning import journal, run_bound, timing
from kerneltune._src.tuning.candidate import Candidate, describe, failure_status
from kerneltune._src.tuning.compile_cost import CompileCostModel
from kerneltune._src.tuning.compiling import CompilePool, Outcome
from kerneltune._src.tuning.output_checks import OutputChecks
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.report import CandidateResult

#: One process times one thing at a time on the device, even when several threads tune.
DEVICE_LOCK = threading.Lock()

#: Default target duration of one sample, by timer. Device time needs no amortising of
#: dispatch: a few calls per sample are enough.
DEFAULT_TARGET_SAMPLE_S = {"cupti": 1e-3, "wallclock": 2e-3}

#: Timers that read device time, unaffected by host load (a custom timer says so with a
#: true `device_time` attribute).
DEVICE_TIMERS = ("cupti",)

#: A candidate this many times slower than the best gets no more samples, by timer:
#: device time is precise, host time can be inflated by a hiccup.
DEFAULT_DROP_FACTOR = {"cupti": 1.5, "wallclock": 2.0}

#: Most calls averaged into one sample.
MAX_CALLS_PER_SAMPLE = {"cupti": 100, "wallclock": 10_000}


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchSettings:
    warmup: int
    rounds: int
    target_sample_s: float | None
    compile_timeout_s: float | None
    max_workers: int
    max_evals: int | None
    deadline: float | None  # time.perf_counter() value
    rtol: Any
    validate: bool
    seed: int
    drop_factor: float | None = None  # None: DEFAULT_DROP_FACTOR for the timer
    run_timeout_s: float | None = None  # None: from the heuristic's first run


#: A timer, or a function that chooses one (and says why it is not the preferred one):
#: called when the first sample is due, so that choosing overlaps the first compiles.
TimerSource = timing.Timer | Callable[[], "tuple[timing.Timer, str | None]"]


class Bench:
    """Implements the `AsyncEvaluator` protocol of `search.py` for one tuning.

    Args:
      lower: the first build stage of a config (tracing and lowering; holds the GIL).
      finish: the second stage, given the first's result (compiling; releases the GIL),
        or None when `lower` already returns the compiled function.
      arg_sets: argument sets to cycle through (or a function making them, called
        before the first run).
      candidates: the configs.
      reference_cfg: outputs are validated against this config's output.
      timer: the timer, or a function choosing it.
      settings: the rest.
      progress: the progress bar.
    """

    def __init__(
        self,
        lower: Callable[[Any], Any],
        finish: Callable[[Any], Any] | None,
        arg_sets: list[list[Any]] | Callable[[], list[list[Any]]],
        candidates: Sequence[Any],
        reference_cfg: Any,
        timer: TimerSource,
        settings: BenchSettings,
        progress: Progress,
        *,
        expected: Callable[[list[list[Any]]], Any] | None = None,
    ) -> None:
        self._lower = lower
        self._finish = finish
        self._arg_source = arg_sets
        self._arg_sets: list[list[Any]] | None = arg_sets if isinstance(arg_sets, list) else None
        self._settings = settings
        self._progress = progress
        self._rng = random.Random(settings.seed)
        self._timer_source = timer
        self._timer: timing.Timer | None = timer if isinstance(timer, timing.Timer) else None
        self.timer_note: str | None = None
        self.cands = [Candidate(i, cfg) for i, cfg in enumerate(candidates)]
        self.reference: Candidate | None = None
        self.reference_is_candidate = False
        if reference_cfg is not None:
            match = next((c for c in self.cands if _same(c.cfg, reference_cfg)), None)
            self.reference_is_candidate = match is not None
            self.reference = match or Candidate(len(self.cands), reference_cfg)
        #: Every config that may be timed: the candidates and a reference that is not one.
        self._timed: list[Candidate] = list(self.cands)
        if self.reference is not None and not self.reference_is_candidate:
            self._timed.append(self.reference)
        self._waiting: list[Candidate] = []  # compiled, waiting for the reference's output
        self.checks = OutputChecks(expected, enabled=settings.validate, rtol=settings.rtol)
        self._reference_first_run_s: float | None = None
        self._awaiting: dict[int, Candidate] = {}  # submitted, not yet reported to the search
        self._pool = CompilePool(settings.max_workers, settings.compile_timeout_s)
        self._cost = CompileCostModel([c.cfg for c in self._timed])
        self._medians: dict[int, float] = {}  # index -> median of those with samples
        self._best_seen = math.inf
        self.evaluations = 0
        #: Seconds while compiles were running (samples were taken meanwhile with a device
        #: timer) and seconds of timing after them.
        self.phases = {"compile": 0.0, "timing": 0.0}

    @property
    def _extra_reference(self) -> bool:
        return self.reference is not None and not self.reference_is_candidate

    @property
    def timer(self) -> timing.Timer:
        if self._timer is None:
            chosen, note = self._timer_source()  # type: ignore[operator]
            self._timer, self.timer_note = chosen, note
        return self._timer

    @property
    def _streaming(self) -> bool:
        t = self.timer
        return t.name in DEVICE_TIMERS or bool(getattr(t, "device_time", False))

    @property
    def arg_sets(self) -> list[list[Any]]:
        if self._arg_sets is None:
            self._arg_sets = self._arg_source()  # type: ignore[operator]
        return self._arg_sets

    # --- the Evaluator protocol -----------------------------------------------------

    @property
    def candidates(self) -> list[Any]:
        return [c.cfg for c in self.cands]

    @property
    def reference_index(self) -> int | None:
        return self.reference.index if self.reference_is_candidate and self.reference else None

    @property
    def workers(self) -> int:
        return self._settings.max_workers

    @property
    def pending(self) -> int:
        """Candidates submitted whose result the search has not received yet."""
        return len(self._awaiting)

    def exhausted(self) -> bool:
        """True when the evaluation or time budget is spent."""
        s = self._settings
        if s.max_evals is not None and self.evaluations >= s.max_evals:
            return True
        return s.deadline is not None and time.perf_counter() >= s.deadline

    def submit(self, indices: Sequence[int], rounds: int | None = None) -> list[int]:
        """Starts evaluating `indices` (those not seen before, within the budget; those
        already evaluated get `rounds` more samples) and returns the ones accepted;
        `wait` returns their results."""
        chosen = [self.cands[i] for i in dict.fromkeys(indices)]
        new = [c for c in chosen if not c.submitted]
        allowed = self._budget_left()
        if allowed is not None:
            new = new[:allowed]
        accepted = [c for c in chosen if c.submitted or c in new]
        rounds = self._settings.rounds if rounds is None else rounds
        self._start(new)
        added = 0
        for c in accepted:
            want = len(c.samples) + rounds if c.ran else rounds
            if c.dropped and c.ok:
                c.dropped = False  # the search asks for more: it gets them
            added += max(0, want - c.target)
            c.target = max(c.target, want)
            self._awaiting[c.index] = c
        ref = self.reference
        if self._extra_reference and ref is not None and ref.target < rounds:
            added += rounds - ref.target
            ref.target = rounds
        self._progress.add_total(added)
        return [c.index for c in accepted]

    def wait(self) -> dict[int, float | None]:
        """Runs the bench until at least one submitted candidate is done and returns the
        median time of each one done since the last call (None when it failed); an empty
        dict when nothing is pending."""
        while self._awaiting:
            done = [c for c in self._awaiting.values() if self._finished(c)]
            if done:
                for c in done:
                    del self._awaiting[c.index]
                return {c.index: c.median for c in done}
            if not self._step(0.05):
                break  # nothing left to run: report what there is
        done = list(self._awaiting.values())
        self._awaiting.clear()
        return {c.index: c.median for c in done}

    def evaluate(
        self, indices: Sequence[int], rounds: int | None = None
    ) -> dict[int, float | None]:
        """Compiles, validates and times `indices` (those not seen before, within the
        budget) and returns the median time of each evaluated one (None when it failed).
        Candidates already timed get `rounds` more samples."""
        accepted = [self.cands[i] for i in self.submit(indices, rounds)]
        while not all(self._finished(c) for c in accepted):
            if not self._step(0.05):
                break
        for c in accepted:
            self._awaiting.pop(c.index, None)
        return {c.index: c.median for c in accepted}

    # --- compiling and the first run ------------------------------------------------

    def _budget_left(self) -> int | None:
        s = self._settings
        if s.deadline is not None and time.perf_counter() >= s.deadline:
            return 0
        return None if s.max_evals is None else max(0, s.max_evals - self.evaluations)

    def _start(self, new: list[Candidate]) -> None:
        ref = self.reference
        jobs = [c for c in new if c is not ref]
        if ref is not None and not ref.submitted:
            jobs.insert(0, ref)  # first: everyone's validation waits on it
        self._progress.add_total(len(jobs))
        for c in jobs:
            c.submitted = True
            if c is not ref or self.reference_is_candidate:
                self.evaluations += 1
            priority = -math.inf if c is ref else -self._cost.predict(c.index)
            self._pool.submit(
                c.index, functools.partial(self._lower, c.cfg), self._finish, priority=priority
            )

    def _step(self, wait_s: float) -> bool:
        """Handles finished compiles and takes one sample if one is due; waits up to
        `wait_s` for a compile when no sample is due. False when there was nothing to
        do or wait for."""
        t0 = time.perf_counter()
        compiling = self._pool.pending > 0
        due = self._due()
        if compiling:
            for outcome in self._pool.poll(0 if due is not None else wait_s):
                self._compiled(self._candidate(outcome.key), outcome)  # type: ignore[arg-type]
            due = self._due()
        if due is not None:
            self._sample_one(due)
            self._progress.advance(1, "timing")
            self._drop_clearly_slow(due)
        self.phases["compile" if compiling else "timing"] += time.perf_counter() - t0
        return compiling or due is not None

    def _candidate(self, index: int) -> Candidate:
        return self.cands[index] if index < len(self.cands) else self.reference  # type: ignore[return-value]

    def _compiled(self, c: Candidate, outcome: Outcome) -> None:
        c.compile_s, c.lower_s = outcome.seconds, outcome.lower_s
        self._progress.advance(1, "compiling")
        if outcome.timed_out:
            c.fail("timeout", f"compiling took more than {self._settings.compile_timeout_s} s")
        elif outcome.error is not None:
            c.fail(failure_status(outcome.error, "compile_error"), describe(outcome.error))
        else:
            c.compiled, c.status = outcome.value, "ok"
        if not outcome.timed_out and self._cost.observe(c.index, outcome.seconds):
            self._pool.reprioritize(self._queued_priority)
        if c.ok:
            if c is self.reference or self._reference_settled():
                self.first_run(c)
            else:
                self._waiting.append(c)
                return
        if c is self.reference:
            waiting, self._waiting = self._waiting, []
            for w in waiting:
                self.first_run(w)

    def _queued_priority(self, key: Any) -> float | None:
        ref = self.reference
        if ref is not None and key == ref.index:
            return None
        return -self._cost.predict(key)

    def _reference_settled(self) -> bool:
        if self.checks.expected(self.arg_sets) is not None:
            return True  # no candidate needs the reference config's output
        ref = self.reference
        return ref is None or (ref.status is not None and (not ref.ok or ref.output is not None))

    def first_run(self, c: Candidate) -> None:
        """Warm-up runs (excluded from the samples); the first one's output is
        validated and gives the estimate that sizes the samples."""
        skipped = journal.excluded_reason(c.cfg)
        if skipped is not None:  # it crashed or hung an earlier (isolated) worker
            c.fail("timeout" if "took more than" in skipped else "run_error", skipped)
            return
        bound = self.run_bound_s()
        journal.running(c.cfg, bound)
        t_first = time.perf_counter()
        try:
            with DEVICE_LOCK:
                out, times = run_bound.warm_up(
                    c.compiled, self.arg_sets, max(1, self._settings.warmup), bound
                )
        except Exception as e:  # a failing candidate is data.
            c.fail(failure_status(e, "run_error"), describe(e))
            return
        finally:
            journal.ran()
        if c is self.reference:
            self._reference_first_run_s = time.perf_counter() - t_first
        if out is run_bound.ABANDONED:
            c.fail(
                "timeout",
                f"its first run took more than {bound:.3g} s (the run-time bound) and was "
                "abandoned; it may still occupy the device (tune in isolated worker "
                "processes to be safe from hangs)",
            )
            return
        c.per_call_s = min(times)
        c.ran = True
        if c is self.reference:
            c.output = out
        self.checks.check(c, out, self.reference, self.arg_sets)

    def settle_by_majority(self) -> None:
        self.checks.settle_by_majority()

    @property
    def validated_by(self) -> str:
        """What outputs were compared with ("" when nothing could be)."""
        return self.checks.validated_by(self.reference)

    @property
    def validated(self) -> bool:
        return bool(self.validated_by)

    def why_not_validated(self) -> str:
        """Why outputs could not be validated although validation is on ("" when they
        were)."""
        return self.checks.why_not(self.reference)

    def run_bound_s(self) -> float:
        """How long a candidate's first run may take before it is abandoned."""
        if self._settings.run_timeout_s is not None:
            return self._settings.run_timeout_s
        return run_bound.bound_s(self._reference_first_run_s)

    # --- timing ---------------------------------------------------------------------

    def _target(self, c: Candidate) -> int:
        s = self._settings
        if s.deadline is not None and time.perf_counter() >= s.deadline:
            return min(c.target, max(1, len(c.samples)))  # out of time: one sample each
        return c.target

    def _finished(self, c: Candidate) -> bool:
        if not c.submitted or (c.status is not None and not c.ok):
            return True
        if c.status is None or not c.ran:
            return False
        return c.dropped or len(c.samples) >= self._target(c)

    def _due(self) -> Candidate | None:
        """The candidate to sample next: of those that want more samples, one with the
        fewest (a host timer waits until no compile runs)."""
        if self._pool.pending and not self._streaming:
            return None
        fewest: list[Candidate] = []
        for c in self._timed:
            if c.ok and c.ran and not c.dropped and len(c.samples) < self._target(c):
                if not fewest or len(c.samples) < len(fewest[0].samples):
                    fewest = [c]
                elif len(c.samples) == len(fewest[0].samples):
                    fewest.append(c)
        return self._rng.choice(fewest) if fewest else None

    def _drop_clearly_slow(self, sampled: Candidate) -> None:
        """After a sample: drops `sampled` if it is clearly slow, and every candidate
        that became clearly slow if the best median improved."""
        drop = self._drop_factor()
        if drop is None or not self._medians:
            return
        best = min(self._medians.values())
        improved = best < self._best_seen
        self._best_seen = min(best, self._best_seen)
        ref = self.reference
        for c in self._timed if improved else [sampled]:
            if (
                c.ok
                and c.samples
                and not c.dropped
                and c is not ref
                and min(c.samples) > best * drop
            ):
                # A candidate's fastest sample decides: noise only makes samples slower.
                c.dropped = True
                self._progress.advance(max(0, c.target - len(c.samples)))

    def _drop_factor(self) -> float | None:
        s = self._settings
        return (
            s.drop_factor if s.drop_factor is not None else DEFAULT_DROP_FACTOR.get(self.timer.name)
        )

    def sample(self, cands: Sequence[Candidate], rounds: int, *, drop_slow: bool = True) -> None:
        """`rounds` interleaved rounds, one sample of each candidate per round.

        After each round, a candidate whose fastest sample is already `drop_factor`
        times the best median so far gets no more samples (a 2x slower config does not
        need three samples to lose), unless `drop_slow` is False.
        """
        cands = [c for c in cands if c.ok]
        if not cands or rounds <= 0:
            return
        s = self._settings
        drop = self._drop_factor()
        start = time.perf_counter()
        self._progress.add_total(rounds * len(cands))
        for r in range(rounds):
            order = list(cands)
            self._rng.shuffle(order)
            for c in order:
                if c.ok:
                    self._sample_one(c)
                self._progress.advance(1, f"timing round {r + 1}/{rounds}")
            if s.deadline is not None and time.perf_counter() >= s.deadline:
                break  # out of time: every candidate has at least one sample
            if drop_slow and drop is not None and r + 1 < rounds:
                cands = self._without_clearly_slow(cands, rounds - r - 1, drop)
        self.phases["timing"] += time.perf_counter() - start

    def _without_clearly_slow(
        self, cands: list[Candidate], rounds_left: int, drop: float
    ) -> list[Candidate]:
        if not self._medians:
            return cands
        limit = min(self._medians.values()) * drop
        keep = [c for c in cands if c.ok and (c is self.reference or min(c.samples) <= limit)]
        self._progress.advance(rounds_left * (len(cands) - len(keep)))
        return keep

    def confirm_slow(self) -> list[Candidate]:
        """Re-measures every candidate judged clearly slow, each right after the best,
        and returns those that are not: no candidate is lost for good to samples that a
        hiccup of a busy machine inflated.

        A candidate is judged clearly slow when its fastest sample is `drop_factor`
        times the best median; the confirming pair compares one fresh sample of each,
        taken back to back under the same load.
        """
        drop = self._drop_factor()
        timed = [c for c in self._timed if c.ok and c.samples]
        if drop is None or len(timed) < 2:
            return []
        best = min(timed, key=lambda c: statistics.median(c.samples))
        limit = statistics.median(best.samples) * drop
        back: list[Candidate] = []
        for c in timed:
            if c is best or min(c.samples) <= limit:
                continue
            self._sample_one(best)
            self._sample_one(c)
            if c.ok and best.ok and c.samples[-1] <= best.samples[-1] * drop:
                c.dropped = False
                back.append(c)
        return back

    def _sample_one(self, c: Candidate) -> None:
        calls = self._calls_for(c)
        start = len(c.samples) * calls
        try:
            with DEVICE_LOCK:
                seconds = self.timer.sample(c.compiled, self.arg_sets, calls, start)
        except timing.TimerFailed as e:
            self._switch_to_wallclock(str(e))
            return self._sample_one(c)
        except Exception as e:
            c.fail(failure_status(e, "run_error"), describe(e))
            self._medians.pop(c.index, None)
            return
        c.samples.append(seconds)
        c.calls = calls
        typical = statistics.median(c.samples)
        self._medians[c.index] = typical
        if typical > 0:
            c.per_call_s = typical

    def _calls_for(self, c: Candidate) -> int:
        target = self._settings.target_sample_s
        if target is None:
            target = DEFAULT_TARGET_SAMPLE_S.get(self.timer.name, 2e-3)
        est = c.per_call_s or target
        cap = MAX_CALLS_PER_SAMPLE.get(self.timer.name, 1000)
        return max(1, min(cap, math.ceil(target / max(est, 1e-9))))

    def _switch_to_wallclock(self, reason: str) -> None:
        """The device timer broke: measure everything again with the wall clock, so
        that no decision compares samples of two different timers."""
        timing.mark_cupti_broken(reason)
        self._timer = timing.WallClockTimer()
        self.timer_note = f"fell back to the wall clock: {reason}"
        timed = [c for c in self._timed if c.samples]
        counts = {c.index: len(c.samples) for c in timed}
        for c in timed:
            c.samples = []
        self._medians.clear()
        self._best_seen = math.inf
        self.sample(timed, max(1, min(3, min(counts.values(), default=1))))

    def close(self) -> None:
        self._pool.close()
        close_timer = getattr(self._timer, "close", None)
        if callable(close_timer):
            close_timer()
        for c in self._timed:
            c.compiled = None
            c.output = None
        self.checks.close()

    def results(self) -> tuple[CandidateResult, ...]:
        return tuple(c.result() for c in self.cands)

    def reference_time(self) -> float | None:
        return self.reference.median if self.reference is not None else None


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # configs with odd __eq__ (e.g. arrays) differ.
        return False
