"""The builds of one bench's candidates on the compile pool (`compiling.py`): the
reference first, then the slowest to compile first (`compile_cost.py`, whose estimates
reorder the queue as builds end), and each build's outcome recorded on its candidate."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kerneltune._src.tuning.candidate import Candidate, describe, failure_status
from kerneltune._src.tuning.compile_cost import CompileCostModel
from kerneltune._src.tuning.compiling import CompileOutcome, CompilePool
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.settings import BenchSettings


class Builds:
    """Builds candidates in the background and hands back those whose build ended.

    Args:
      lower: the first build stage of a config (tracing and lowering; holds the GIL).
      finish: the second stage, given the first's result (compiling; releases the GIL),
        or None when `lower` already returns the compiled function.
      timed: every candidate that may be built (their indices are the pool's keys).
      reference: the reference config's candidate, built before all others, or None.
      settings, progress: the bench's settings (workers, compile timeout) and its bar.
    """

    def __init__(
        self,
        lower: Callable[[Any], Any],
        finish: Callable[[Any], Any] | None,
        timed: Sequence[Candidate],
        reference: Candidate | None,
        settings: BenchSettings,
        progress: Progress,
    ) -> None:
        self._lower = lower
        self._finish = finish
        self._by_index = {c.index: c for c in timed}
        self._reference = reference
        self._compile_timeout_s = settings.compile_timeout_s
        self._progress = progress
        self._pool = CompilePool(settings.max_workers, settings.compile_timeout_s)
        self._cost = CompileCostModel([c.cfg for c in timed])

    @property
    def pending(self) -> int:
        """Builds started that have not ended."""
        return self._pool.pending

    def start(self, c: Candidate) -> None:
        """Queues a candidate's build: the reference ahead of everything (every
        validation waits on its output), the others slowest to compile first."""
        priority = -math.inf if c is self._reference else -self._cost.predict(c.index)
        self._pool.submit(
            c.index, functools.partial(self._lower, c.cfg), self._finish, priority=priority
        )

    def ended(self, wait_s: float) -> Iterator[Candidate]:
        """The candidates whose build ended (waiting up to `wait_s` for one), each
        compiled or failed; one is recorded as the one before it is handled."""
        for outcome in self._pool.poll(wait_s):
            c = self._by_index[outcome.key]  # type: ignore[index]
            self._record(c, outcome)
            yield c

    def _record(self, c: Candidate, outcome: CompileOutcome) -> None:
        c.compile_s, c.lower_s = outcome.seconds, outcome.lower_s
        self._progress.advance(1, "compiling")
        if outcome.timed_out:
            c.fail("timeout", f"compiling took more than {self._compile_timeout_s} s")
        elif outcome.error is not None:
            c.fail(failure_status(outcome.error, "compile_error"), describe(outcome.error))
        else:
            c.compiled_as(outcome.value)
        if not outcome.timed_out and self._cost.observe(c.index, outcome.seconds):
            self._pool.reprioritize(self._queued_priority)

    def _queued_priority(self, key: Any) -> float | None:
        ref = self._reference
        if ref is not None and key == ref.index:
            return None
        return -self._cost.predict(key)

    def queued(self) -> list[Candidate]:
        """The candidates whose build waits in a queue (lowered or not, no stage of it
        running)."""
        return [self._by_index[key] for key in self._pool.queued()]  # type: ignore[index]

    def cancel(self, c: Candidate) -> None:
        """Drops a candidate's build (a running one goes on; its result is ignored)."""
        self._pool.cancel(c.index)

    def close(self) -> None:
        self._pool.close()
