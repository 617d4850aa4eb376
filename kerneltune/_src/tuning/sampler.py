"""Sampling compiled candidates: interleaved rounds on one timer, the rule that stops
sampling a clearly slow candidate (and the re-measure that can bring it back), and the
fall-back to the wall clock when a device timer breaks.

A candidate is *clearly slow* when its fastest sample is `drop_factor` times the best
median so far (noise only makes samples slower, so its fastest sample is its best
case). That one rule applies between rounds, after each sample while compiles are
still running, and in `confirm_slow`, which re-measures each dropped candidate right
after the best one before anything is decided.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from kerneltune._src.tuning import timing
from kerneltune._src.tuning.candidate import Candidate, describe, failure_status
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.settings import BenchSettings

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

#: A timer, or a function that chooses one (and says why it is not the preferred one):
#: called when the first sample is due, so that choosing overlaps the first compiles.
TimerSource = timing.Timer | Callable[[], "tuple[timing.Timer, str | None]"]


def clearly_slow(c: Candidate, best_median: float, drop: float) -> bool:
    """The drop rule: `c`'s fastest sample is `drop` times the best median. Its fastest
    sample decides, since noise only makes samples slower."""
    return bool(c.samples) and min(c.samples) > best_median * drop


class Sampler:
    """Takes the samples of one tuning.

    Args:
      timer: the timer, or a function choosing it when the first sample is due.
      settings: the bench's settings (sample length, drop factor, deadline, seed).
      progress: the progress bar.
      arg_sets: returns the argument sets to cycle through.
      timed: every candidate that may be timed.
      reference: the heuristic config's candidate (never dropped: its time is the
        baseline), or None.
      phases: where the seconds spent timing are added up (key "timing").
    """

    def __init__(
        self,
        timer: TimerSource,
        settings: BenchSettings,
        progress: Progress,
        arg_sets: Callable[[], list[list[Any]]],
        timed: list[Candidate],
        reference: Candidate | None,
        phases: dict[str, float],
    ) -> None:
        self._timer_source = timer
        self._timer: timing.Timer | None = timer if isinstance(timer, timing.Timer) else None
        self.timer_note: str | None = None
        self._settings = settings
        self._progress = progress
        self._arg_sets = arg_sets
        self._timed = timed
        self._reference = reference
        self._phases = phases
        self.rng = random.Random(settings.seed)
        self._medians: dict[int, float] = {}  # index -> median of those with samples
        self._best_seen = math.inf

    @property
    def timer(self) -> timing.Timer:
        if self._timer is None:
            chosen, note = self._timer_source()  # type: ignore[operator]
            self._timer, self.timer_note = chosen, note
        return self._timer

    def drop_clearly_slow(self, sampled: Candidate) -> None:
        """After a sample: drops `sampled` if it is clearly slow, and every candidate
        that became clearly slow if the best median improved."""
        drop = self.drop_factor()
        if drop is None or not self._medians:
            return
        best = min(self._medians.values())
        improved = best < self._best_seen
        self._best_seen = min(best, self._best_seen)
        ref = self._reference
        for c in self._timed if improved else [sampled]:
            if c.ok and not c.dropped and c is not ref and clearly_slow(c, best, drop):
                c.drop()
                self._progress.advance(max(0, c.target - len(c.samples)))

    def drop_factor(self) -> float | None:
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
        drop = self.drop_factor()
        start = time.perf_counter()
        self._progress.add_total(rounds * len(cands))
        for r in range(rounds):
            order = list(cands)
            self.rng.shuffle(order)
            for c in order:
                if c.ok:
                    self.sample_one(c)
                self._progress.advance(1, f"timing round {r + 1}/{rounds}")
            if s.deadline is not None and time.perf_counter() >= s.deadline:
                break  # out of time: every candidate has at least one sample
            if drop_slow and drop is not None and r + 1 < rounds:
                cands = self._without_clearly_slow(cands, rounds - r - 1, drop)
        self._phases["timing"] += time.perf_counter() - start

    def _without_clearly_slow(
        self, cands: list[Candidate], rounds_left: int, drop: float
    ) -> list[Candidate]:
        if not self._medians:
            return cands
        best = min(self._medians.values())
        ref = self._reference
        keep = [c for c in cands if c.ok and (c is ref or not clearly_slow(c, best, drop))]
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
        drop = self.drop_factor()
        timed = [c for c in self._timed if c.ok and c.samples]
        if drop is None or len(timed) < 2:
            return []
        best = min(timed, key=lambda c: statistics.median(c.samples))
        best_median = statistics.median(best.samples)
        back: list[Candidate] = []
        for c in timed:
            if c is best or not clearly_slow(c, best_median, drop):
                continue
            self.sample_one(best)
            self.sample_one(c)
            if c.ok and best.ok and c.samples[-1] <= best.samples[-1] * drop:
                if c.dropped:
                    c.resume()
                back.append(c)
        return back

    def sample_one(self, c: Candidate) -> None:
        calls = self._calls_for(c)
        start = len(c.samples) * calls
        try:
            with timing.DEVICE_LOCK:  # one thing timed at a time, whatever thread tunes
                seconds = self.timer.sample(c.compiled, self._arg_sets(), calls, start)
        except timing.TimerFailed as e:
            self._switch_to_wallclock(str(e))
            return self.sample_one(c)
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
        close_timer = getattr(self._timer, "close", None)
        if callable(close_timer):
            close_timer()
