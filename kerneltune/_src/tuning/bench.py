"""The bench: compiles, validates and times candidates for one tuning.

A search strategy asks the bench to `evaluate` some candidates; the bench compiles the
new ones in parallel threads (each with a timeout), runs each once as soon as it is
compiled (a warm-up whose output is validated against the reference config's output),
and then times them in interleaved rounds: every round visits the candidates in a new
random order and takes one sample of each, so slow drifts (clocks, temperature, other
load) spread over all candidates instead of biasing the ones timed last.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from kerneltune._src.tuning import timing, validate
from kerneltune._src.tuning.compiling import CompilePool, Outcome
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.report import CandidateResult, Status

#: One process times one thing at a time on the device, even when several threads tune.
DEVICE_LOCK = threading.Lock()

#: Default target duration of one sample, by timer: device timers need few calls.
DEFAULT_TARGET_SAMPLE_S = {"cupti": 2e-3, "wallclock": 2e-3}

#: Timers that read device time, unaffected by host load.
DEVICE_TIMERS = ("cupti",)

#: A candidate this many times slower than the best gets no more samples, by timer:
#: device time is precise, host time can be inflated by a hiccup.
DEFAULT_DROP_FACTOR = {"cupti": 1.5, "wallclock": 2.0}

#: Most calls averaged into one sample.
MAX_CALLS_PER_SAMPLE = {"cupti": 100, "wallclock": 10_000}


@dataclasses.dataclass
class Candidate:
    index: int
    cfg: Any
    status: Status | None = None  # None: not evaluated yet (or still compiling).
    submitted: bool = False
    compiled: Any = None
    error: str | None = None
    compile_s: float | None = None
    rel_error: float | None = None
    per_call_s: float | None = None  # estimate from the warm-up, refined by samples
    calls: int = 1
    samples: list[float] = dataclasses.field(default_factory=list)
    output: Any = None  # kept for the reference only

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.ok and self.samples else None

    def fail(self, status: Status, error: str) -> None:
        self.status, self.error, self.compiled, self.samples = status, error, None, []

    def result(self) -> CandidateResult:
        return CandidateResult(
            cfg=self.cfg,
            status=self.status or "pruned",
            time_s=self.median,
            samples_s=tuple(self.samples),
            error=self.error,
            compile_s=self.compile_s,
            rel_error=self.rel_error,
            calls_per_sample=self.calls if self.samples else None,
        )


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


class Bench:
    """Implements the `Evaluator` protocol of `search.py` for one tuning."""

    def __init__(
        self,
        build: Callable[[Any], Any],
        arg_sets: list[list[Any]],
        candidates: Sequence[Any],
        reference_cfg: Any,
        timer: timing.Timer,
        settings: BenchSettings,
        progress: Progress,
    ) -> None:
        self._build = build
        self._arg_sets = arg_sets
        self._settings = settings
        self._progress = progress
        self._rng = random.Random(settings.seed)
        self.timer = timer
        self.timer_note: str | None = None
        self.cands = [Candidate(i, cfg) for i, cfg in enumerate(candidates)]
        self.reference: Candidate | None = None
        self.reference_is_candidate = False
        if reference_cfg is not None:
            match = next((c for c in self.cands if _same(c.cfg, reference_cfg)), None)
            self.reference_is_candidate = match is not None
            self.reference = match or Candidate(len(self.cands), reference_cfg)
        self._waiting: list[Candidate] = []  # compiled, waiting for the reference's output
        self._pool = CompilePool(settings.max_workers, settings.compile_timeout_s)
        self.evaluations = 0
        self._targets: dict[int, int] = {}
        #: Seconds spent waiting for compiles and taking samples.
        self.phases = {"compile": 0.0, "timing": 0.0}

    @property
    def _streaming(self) -> bool:
        return self.timer.name in DEVICE_TIMERS

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

    def exhausted(self) -> bool:
        """True when the evaluation or time budget is spent."""
        s = self._settings
        if s.max_evals is not None and self.evaluations >= s.max_evals:
            return True
        return s.deadline is not None and time.perf_counter() >= s.deadline

    def evaluate(
        self, indices: Sequence[int], rounds: int | None = None
    ) -> dict[int, float | None]:
        """Compiles, validates and times `indices` (those not seen before, within the
        budget) and returns the median time of each evaluated one (None when it failed).
        Candidates already timed get `rounds` more samples."""
        chosen = [self.cands[i] for i in dict.fromkeys(indices)]
        new = [c for c in chosen if not c.submitted]
        allowed = self._budget_left()
        if allowed is not None:
            new = new[:allowed]
        rounds = self._settings.rounds if rounds is None else rounds
        ref = self.reference
        extra = [ref] if ref is not None and not self.reference_is_candidate else []
        targets = {id(c): len(c.samples) + rounds for c in [*chosen, *extra]}
        self._targets = targets  # samples taken while compiling count towards these
        self._prepare(new)
        self._targets = {}
        active = [c for c in chosen if c.submitted and c.ok]
        active += [c for c in extra if c.ok]
        self.sample(active, rounds, targets=targets)
        return {c.index: c.median for c in chosen if c.submitted}

    # --- compiling and the first run ------------------------------------------------

    def _budget_left(self) -> int | None:
        s = self._settings
        if s.deadline is not None and time.perf_counter() >= s.deadline:
            return 0
        return None if s.max_evals is None else max(0, s.max_evals - self.evaluations)

    def _prepare(self, new: list[Candidate]) -> None:
        ref = self.reference
        jobs = [c for c in new if c is not ref]
        if ref is not None and not ref.submitted:
            jobs.insert(0, ref)  # first in the queue: everyone's validation waits on it
        if not jobs:
            return
        self._progress.add_total(len(jobs))
        for c in jobs:
            c.submitted = True
            if c is not ref or self.reference_is_candidate:
                self.evaluations += 1
            self._pool.submit(c.index, _Job(self._build, c.cfg))
        by_index = {c.index: c for c in jobs}
        start = time.perf_counter()
        while self._pool.pending:
            for outcome in self._pool.poll(0.05):
                c = by_index.get(outcome.key)  # type: ignore[call-overload]
                if c is not None:
                    self._compiled(c, outcome)
        self.phases["compile"] += time.perf_counter() - start
        waiting, self._waiting = self._waiting, []
        for c in waiting:
            self.first_run(c)

    def _compiled(self, c: Candidate, outcome: Outcome) -> None:
        c.compile_s = outcome.seconds
        self._progress.advance(1, "compiling")
        if outcome.timed_out:
            c.fail("timeout", f"compiling took more than {self._settings.compile_timeout_s} s")
        elif outcome.error is not None:
            c.fail(_failure_status(outcome.error, "compile_error"), describe(outcome.error))
        else:
            c.compiled, c.status = outcome.value, "ok"
            if c is self.reference or self._reference_settled():
                self.first_run(c)
            else:
                self._waiting.append(c)
                return
        if c is self.reference:
            waiting, self._waiting = self._waiting, []
            for w in waiting:
                self.first_run(w)

    def _reference_settled(self) -> bool:
        ref = self.reference
        return ref is None or (ref.status is not None and (not ref.ok or ref.output is not None))

    def first_run(self, c: Candidate) -> None:
        """Warm-up runs (excluded from the samples); the first one's output is
        validated and gives the estimate that sizes the samples."""
        warmup = max(1, self._settings.warmup)
        try:
            with DEVICE_LOCK:
                times = []
                out = None
                for i in range(warmup):
                    t0 = time.perf_counter()
                    result = c.compiled(*self._arg_sets[i % len(self._arg_sets)])
                    jax.block_until_ready(result)
                    times.append(time.perf_counter() - t0)
                    if i == 0:
                        out = result
        except Exception as e:  # a failing candidate is data.
            c.fail(_failure_status(e, "run_error"), describe(e))
            return
        c.per_call_s = min(times)
        ref = self.reference
        if c is ref:
            c.output = out
        if not self._settings.validate:
            return
        if ref is not None and ref.ok and ref.output is not None and c is not ref:
            verdict = validate.compare(out, ref.output, self._settings.rtol)
            c.rel_error = verdict.rel_error
            if not verdict.ok:
                c.fail("invalid", f"output differs from the reference config's: {verdict.reason}")
        elif validate.has_nan(out):
            c.fail("invalid", "output contains NaN")
        if c.ok and self._streaming and len(c.samples) < self._targets.get(id(c), 0):
            # A device timer is not disturbed by the compiles still running on the
            # host, so the first round is taken now instead of after all compiles.
            self._sample_one(c)

    @property
    def validated(self) -> bool:
        ref = self.reference
        return self._settings.validate and ref is not None and ref.ok

    # --- timing ---------------------------------------------------------------------

    def sample(
        self,
        cands: Sequence[Candidate],
        rounds: int,
        *,
        targets: dict[int, int] | None = None,
        drop_slow: bool = True,
    ) -> None:
        """`rounds` interleaved rounds, one sample of each candidate per round (a
        candidate that already has `targets[id(c)]` samples sits a round out).

        After each round, a candidate whose fastest sample is already `drop_factor`
        times the best median so far gets no more samples (a 2x slower config does not
        need three samples to lose), unless `drop_slow` is False.
        """
        cands = [c for c in cands if c.ok]
        if not cands or rounds <= 0:
            return
        s = self._settings
        drop = (
            s.drop_factor if s.drop_factor is not None else DEFAULT_DROP_FACTOR.get(self.timer.name)
        )
        start = time.perf_counter()
        self._progress.add_total(rounds * len(cands))
        for r in range(rounds):
            order = list(cands)
            self._rng.shuffle(order)
            for c in order:
                if c.ok and (targets is None or len(c.samples) < targets.get(id(c), 0)):
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
        medians = [c.median for c in [*self.cands, self.reference] if c is not None and c.median]
        if not medians:
            return cands
        limit = min(medians) * drop
        # A candidate's fastest sample decides: noise only ever makes samples slower.
        keep = [c for c in cands if c.ok and (c is self.reference or min(c.samples) <= limit)]
        self._progress.advance(rounds_left * (len(cands) - len(keep)))
        return keep

    def _sample_one(self, c: Candidate) -> None:
        calls = self._calls_for(c)
        start = len(c.samples) * calls
        try:
            with DEVICE_LOCK:
                seconds = self.timer.sample(c.compiled, self._arg_sets, calls, start)
        except timing.TimerFailed as e:
            self._switch_to_wallclock(str(e))
            return self._sample_one(c)
        except Exception as e:
            c.fail(_failure_status(e, "run_error"), describe(e))
            return
        c.samples.append(seconds)
        c.calls = calls
        typical = statistics.median(c.samples)
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
        self.timer = timing.WallClockTimer()
        self.timer_note = f"fell back to the wall clock: {reason}"
        timed = [c for c in [*self.cands, self.reference] if c is not None and c.samples]
        counts = {c.index: len(c.samples) for c in timed}
        for c in timed:
            c.samples = []
        self.sample(timed, max(1, min(3, min(counts.values(), default=1))))

    def close(self) -> None:
        self._pool.close()
        close_timer = getattr(self.timer, "close", None)
        if callable(close_timer):
            close_timer()
        for c in [*self.cands, self.reference]:
            if c is not None:
                c.compiled = None
                c.output = None

    def results(self) -> tuple[CandidateResult, ...]:
        return tuple(c.result() for c in self.cands)

    def reference_time(self) -> float | None:
        return self.reference.median if self.reference is not None else None


@dataclasses.dataclass(frozen=True)
class _Job:
    build: Callable[[Any], Any]
    cfg: Any

    def __call__(self) -> Any:
        return self.build(self.cfg)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # configs with odd __eq__ (e.g. arrays) differ.
        return False


def _failure_status(e: BaseException, default: Status) -> Status:
    text = f"{type(e).__name__}: {e}".lower()
    if default == "run_error" and ("resource_exhausted" in text or "out of memory" in text):
        return "oom"
    if "out of memory" in text and "shared memory" not in text:
        return "oom"
    return default


def describe(e: BaseException) -> str:
    """A failure as one line of at most 300 characters."""
    text = f"{type(e).__name__}: {e}".strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return type(e).__name__
