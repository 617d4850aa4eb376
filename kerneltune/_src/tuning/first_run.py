"""The first runs of a bench's candidates: warm-up runs within the run-time bound
(`run_bound.py`), the first one's output validated (`output_checks.py`).

The reference config runs first: its first run sets the bound of the others, and its
output is the bar theirs are held to, so a candidate built before that output is known
waits for it (unless a reference implementation's output is the bar instead).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kerneltune._src.tuning import inputs, journal, run_bound, timing
from kerneltune._src.tuning.candidate import Candidate, describe, failure_status
from kerneltune._src.tuning.output_checks import OutputChecks
from kerneltune._src.tuning.settings import BenchSettings


class FirstRuns:
    """Runs each built candidate once (and the warm-ups), in an order that lets every
    output be validated.

    Args:
      args: the bench's argument sets.
      reference: the reference config's candidate, or None.
      settings: the bench's settings (warm-up runs, run-time bound, validation).
      expected: makes the reference implementation's output from the argument sets,
        or None (the reference config's output is the bar).
    """

    def __init__(
        self,
        args: inputs.LazyArgSets,
        reference: Candidate | None,
        settings: BenchSettings,
        expected: Callable[[list[list[Any]]], Any] | None,
    ) -> None:
        self._args = args
        self._reference = reference
        self._settings = settings
        self.checks = OutputChecks(expected, enabled=settings.validate, rtol=settings.rtol)
        self._waiting: list[Candidate] = []  # built, waiting for the reference's output
        self._reference_first_run_s: float | None = None

    def built(self, c: Candidate) -> None:
        """Runs a candidate whose build just ended, or has it wait for the reference's
        output; the reference's own outcome (run or failed) lets the waiting ones run."""
        if c.ok:
            if c is self._reference or self._reference_settled():
                self.run(c)
            else:
                self._waiting.append(c)
                return
        if c is self._reference:
            for w in self.take_waiting():
                self.run(w)

    def take_waiting(self, keep: Candidate | None = None) -> list[Candidate]:
        """The candidates waiting for the reference's output, which no longer wait
        (but `keep`, which waits on)."""
        waiting = [c for c in self._waiting if c is not keep]
        self._waiting = [c for c in self._waiting if c is keep]
        return waiting

    def _reference_settled(self) -> bool:
        if self.checks.expected(self._args()) is not None:
            return True  # no candidate needs the reference config's output
        ref = self._reference
        return ref is None or (ref.status is not None and (not ref.ok or ref.output is not None))

    def run(self, c: Candidate) -> None:
        """Warm-up runs (excluded from the samples); the first one's output is
        validated and gives the estimate that sizes the samples."""
        skipped = journal.excluded_reason(c.cfg)
        if skipped is not None:  # it crashed or hung an earlier (isolated) worker
            c.fail("timeout" if "took more than" in skipped else "run_error", skipped)
            return
        bound = self.bound_s()
        journal.running(c.cfg, bound)
        t_first = time.perf_counter()
        try:
            with timing.DEVICE_LOCK:
                out, times = run_bound.warm_up(
                    c.compiled, self._args(), max(1, self._settings.warmup), bound
                )
        except Exception as e:  # a failing candidate is data.
            c.fail(failure_status(e, "run_error"), describe(e))
            return
        finally:
            journal.ran()
        if c is self._reference:
            self._reference_first_run_s = time.perf_counter() - t_first
        if out is run_bound.ABANDONED:
            c.fail(
                "timeout",
                f"its first run took more than {bound:.3g} s (the run-time bound) and was "
                "abandoned; it may still occupy the device (tune in isolated worker "
                "processes to be safe from hangs)",
            )
            return
        c.ran_once(min(times))
        if c is self._reference:
            c.output = out
        self.checks.check(c, out, self._reference, self._args())

    def bound_s(self) -> float:
        """How long a candidate's first run may take before it is abandoned."""
        if self._settings.run_timeout_s is not None:
            return self._settings.run_timeout_s
        return run_bound.bound_s(self._reference_first_run_s)

    def settle_by_majority(self) -> None:
        self.checks.settle_by_majority()

    @property
    def validated_by(self) -> str:
        """What outputs were compared with ("" when nothing could be)."""
        return self.checks.validated_by(self._reference)

    def why_not_validated(self) -> str:
        """Why outputs could not be validated although validation is on ("" when they
        were)."""
        return self.checks.why_not(self._reference)

    def close(self) -> None:
        self.checks.close()
