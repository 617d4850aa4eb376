"""The bench: compiles, validates and times candidates for one tuning.

A search strategy hands the bench candidates (`evaluate`, or `submit` and `wait` for
a search that proposes the next candidates as soon as any result lands). The bench
builds them on the compile pool (`compiling.py`: one lowering thread feeding the compile
threads, the slowest to compile first), runs each once as soon as it is compiled
(`first_run.py`: a warm-up within a bound, its output validated), and times them
(`sampler.py`).

Timing is an event loop on the calling thread: between compile results it takes one
sample of the compiled candidate with the fewest samples (ties in random order), so the
candidates are visited in interleaved rounds and slow drifts (clocks, temperature, other
load) spread over all of them instead of biasing the ones timed last. A device timer is
not disturbed by compiles running on the host, so with one the device is kept busy
while the rest still compile; a host timer (the wall clock) waits until no compile is
running. A clearly slow candidate gets no more samples (the rule is in `sampler.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from kerneltune._src.tuning import inputs, timing
from kerneltune._src.tuning.builds import Builds
from kerneltune._src.tuning.candidate import Candidate
from kerneltune._src.tuning.first_run import FirstRuns
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.report import CandidateResult
from kerneltune._src.tuning.sampler import DEVICE_TIMERS, Sampler, TimerSource
from kerneltune._src.tuning.settings import BenchSettings


class Bench:
    """Implements the `AsyncEvaluator` protocol of `search.py` for one tuning.

    Args:
      lower: the first build stage of a config (tracing and lowering; holds the GIL).
      finish: the second stage, given the first's result (compiling; releases the GIL),
        or None when `lower` already returns the compiled function.
      arg_sets: argument sets to cycle through (or a function making them, called
        before the first run).
      candidates: the configs.
      reference_cfg: the heuristic config (outputs are validated against its output).
      timer, settings, progress: the timer (or a function choosing it), the rest, the bar.
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
        # Shared with the sampler and the first runs, not reached through `self`: a
        # cycle through the bench kept its inputs and outputs on the device after
        # tuning, until Python's cycle collector happened to run (a GPT block's step ran
        # beside 1.2 GiB of them).
        self._args = inputs.LazyArgSets(arg_sets)
        self._settings = settings
        self._progress = progress
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
        #: Runs each candidate once when it is built, validating its output.
        self.first_runs = FirstRuns(self._args, self.reference, settings, expected)
        self._awaiting: dict[int, Candidate] = {}  # submitted, not yet reported to the search
        self._builds = Builds(lower, finish, self._timed, self.reference, settings, progress)
        self.evaluations = 0
        #: Seconds while compiles were running (samples were taken meanwhile with a device
        #: timer) and seconds of timing after them.
        self.phases = {"compile": 0.0, "timing": 0.0}
        self.sampler = Sampler(
            timer,
            settings,
            progress,
            self._args,
            self._timed,
            self.reference,
            self.phases,
        )

    @property
    def _extra_reference(self) -> bool:
        return self.reference is not None and not self.reference_is_candidate

    @property
    def timer(self) -> timing.Timer:
        return self.sampler.timer

    @property
    def timer_note(self) -> str | None:
        return self.sampler.timer_note

    def sample(self, cands: Sequence[Candidate], rounds: int) -> None:
        self.sampler.sample(cands, rounds)

    def confirm_slow(self) -> list[Candidate]:
        return self.sampler.confirm_slow()

    @property
    def _streaming(self) -> bool:
        t = self.timer
        return t.name in DEVICE_TIMERS or bool(getattr(t, "device_time", False))

    # --- the Evaluator protocol -----------------------------------------------------

    @property
    def candidates(self) -> list[Any]:
        return [c.cfg for c in self.cands]

    @property
    def reference_index(self) -> int | None:
        return self.reference.index if self.reference_is_candidate and self.reference else None

    @property
    def workers(self) -> int:
        at_once, threads = self._settings.compiles_at_once, self._settings.max_workers
        return threads if at_once is None else min(at_once, threads)

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
            if c.dropped:
                c.resume()  # the search asks for more: it gets them
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

    # --- the event loop: builds, first runs, samples --------------------------------

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
            c.submit()
            if c is not ref or self.reference_is_candidate:
                self.evaluations += 1
            self._builds.start(c)

    def _step(self, wait_s: float) -> bool:
        """Handles finished compiles and takes one sample if one is due; waits up to
        `wait_s` for a compile when no sample is due. False when there was nothing to
        do or wait for."""
        t0 = time.perf_counter()
        self._abandon_late()
        self._skip_unstarted()
        compiling = self._builds.pending > 0
        due = self._due()
        if compiling:
            for c in self._builds.ended(0 if due is not None else wait_s):
                self.first_runs.built(c)
            due = self._due()
        if due is not None:
            self.sampler.sample_one(due)
            self._progress.advance(1, "timing")
            self.sampler.drop_clearly_slow(due)
        self.phases["compile" if compiling else "timing"] += time.perf_counter() - t0
        return compiling or due is not None

    def _abandon_late(self) -> None:
        """With `abandon_late`, once the deadline has passed, the candidates that have
        not run yet (building, or waiting for the reference's output) are given up:
        "pruned", as a search skips a candidate, so that processes that agree on a
        winner do not count them as failures. A build cannot be stopped: its thread
        runs on and its result is dropped.

        The first candidate given (a first call's first choice) is waited for
        `first_grace_s` longer: given up, it left a winner that only showed which
        configs build fastest (on an H200 a grouped matmul's predicted Triton tile,
        8% off the best, was cut at 128 experts, and at 256 experts the prediction
        used untimed was 42% off where the timed heuristic was 21%)."""
        s = self._settings
        now = time.perf_counter()
        if not s.abandon_late or s.deadline is None or now < s.deadline:
            return
        first = self.cands[0] if self.cands else None
        spared = first if now < s.deadline + s.first_grace_s else None
        waiting = self.first_runs.take_waiting(keep=spared)
        late = [c for c in self._timed if c.submitted and c.status is None and c is not spared]
        late += waiting
        for c in late:
            self._builds.cancel(c)
            c.fail("pruned", "not run before the tuning's time budget ran out")

    def _skip_unstarted(self) -> None:
        """Once the deadline has passed, the builds still waiting in a queue are given
        up ("pruned"): no candidate starts after `time_budget_s`, and an exhaustive
        search (or halving's first round) hands every candidate to the builds at once,
        so without this the whole space was built and run whatever the budget. The
        reference is kept: the candidates' validation waits on its output."""
        s = self._settings
        if s.abandon_late or s.deadline is None or time.perf_counter() < s.deadline:
            return  # `_abandon_late` gives up more, and spares the first candidate
        for c in self._builds.queued():
            if c is not self.reference:
                self._builds.cancel(c)
                c.fail("pruned", "not started before the tuning's time budget ran out")

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
        if self._builds.pending and not self._streaming:
            return None
        fewest: list[Candidate] = []
        for c in self._timed:
            if c.ok and c.ran and not c.dropped and len(c.samples) < self._target(c):
                if not fewest or len(c.samples) < len(fewest[0].samples):
                    fewest = [c]
                elif len(c.samples) == len(fewest[0].samples):
                    fewest.append(c)
        return self.sampler.rng.choice(fewest) if fewest else None

    def close(self) -> None:
        self._builds.close()
        self.sampler.close()
        for c in self._timed:
            c.compiled = None
            c.output = None
        self.first_runs.close()

    def results(self) -> tuple[CandidateResult, ...]:
        return tuple(c.result() for c in self.cands)

    def reference_time(self) -> float | None:
        return self.reference.median if self.reference is not None else None


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # configs with odd __eq__ (e.g. arrays) differ.
        return False
