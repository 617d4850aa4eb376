"""One candidate config's state while it is tuned, and how failures are described."""

from __future__ import annotations

import dataclasses
import enum
import statistics
from typing import Any

from kerneltune._src.tuning.report import CandidateResult, Status


class Phase(enum.Enum):
    """Where a candidate is in its evaluation."""

    WAITING = "waiting"  # not submitted yet
    COMPILING = "compiling"  # in the compile pool
    COMPILED = "compiled"  # its first run waits (e.g. for the reference config's output)
    TIMED = "timed"  # ran once and validated: takes samples
    DROPPED = "dropped"  # clearly slow: no more samples unless the search asks again
    FAILED = "failed"  # ended with a failure status and a reason


#: The moves `Candidate._move` allows; any other is a bug in the bench.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.WAITING: frozenset({Phase.COMPILING, Phase.COMPILED, Phase.FAILED}),
    Phase.COMPILING: frozenset({Phase.COMPILED, Phase.FAILED}),
    Phase.COMPILED: frozenset({Phase.TIMED, Phase.FAILED}),
    Phase.TIMED: frozenset({Phase.DROPPED, Phase.FAILED}),
    Phase.DROPPED: frozenset({Phase.TIMED, Phase.FAILED}),
    Phase.FAILED: frozenset(),
}


@dataclasses.dataclass
class Candidate:
    """A config on the bench, moved through its `Phase`s by the methods below, which
    all go through `_move`: submitted, compiled, run once (validated), then sampled
    until done or dropped; `fail` ends it from any phase with a status and a reason."""

    index: int
    cfg: Any
    phase: Phase = Phase.WAITING
    compiled: Any = None
    error: str | None = None
    failure: Status | None = None
    compile_s: float | None = None
    lower_s: float | None = None
    rel_error: float | None = None
    per_call_s: float | None = None  # estimate from the warm-up, refined by samples
    calls: int = 1
    samples: list[float] = dataclasses.field(default_factory=list)
    output: Any = None  # kept for the reference only
    target: int = 0  # samples wanted by the search

    def _move(self, to: Phase) -> bool:
        """The one transition function: False (and no change) when the candidate has
        already failed (its first failure stands); raises on any other illegal move."""
        if self.phase is Phase.FAILED:
            return False
        if to not in TRANSITIONS[self.phase]:
            raise RuntimeError(
                f"candidate #{self.index} ({self.cfg}) cannot go from {self.phase.value} "
                f"to {to.value}"
            )
        self.phase = to
        return True

    def submit(self) -> None:
        self._move(Phase.COMPILING)

    def compiled_as(self, program: Any) -> None:
        if self._move(Phase.COMPILED):
            self.compiled = program

    def ran_once(self, per_call_s: float) -> None:
        if self._move(Phase.TIMED):
            self.per_call_s = per_call_s

    def drop(self) -> None:
        self._move(Phase.DROPPED)

    def resume(self) -> None:
        """A dropped candidate takes samples again (the search asked for more)."""
        self._move(Phase.TIMED)

    def fail(self, status: Status, error: str) -> None:
        if self._move(Phase.FAILED):
            self.failure, self.error, self.compiled, self.samples = status, error, None, []

    @property
    def status(self) -> Status | None:
        """ "ok" once compiled and not failed; the failure's status; None before."""
        if self.phase is Phase.FAILED:
            return self.failure
        return None if self.phase in (Phase.WAITING, Phase.COMPILING) else "ok"

    @property
    def submitted(self) -> bool:
        return self.phase is not Phase.WAITING

    @property
    def ran(self) -> bool:
        """Ran once and was validated (and has not failed since)."""
        return self.phase in (Phase.TIMED, Phase.DROPPED)

    @property
    def dropped(self) -> bool:
        return self.phase is Phase.DROPPED

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.ok and self.samples else None

    def result(self) -> CandidateResult:
        # A candidate the search passed over says so (explain, reports and the cache
        # entry showed "pruned: None").
        untried = self.status is None and self.error is None
        return CandidateResult(
            cfg=self.cfg,
            status=self.status or "pruned",
            time_s=self.median,
            samples_s=tuple(self.samples),
            error=UNTRIED if untried else self.error,
            compile_s=self.compile_s,
            rel_error=self.rel_error,
            calls_per_sample=self.calls if self.samples else None,
            lower_s=self.lower_s,
        )


#: The error text of a candidate that a search strategy (or its budget) never tried.
UNTRIED = "not tried by the search"


def failure_status(e: BaseException, default: Status) -> Status:
    """The status a failure gets: "oom" when it ran out of device memory, else
    `default`."""
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
