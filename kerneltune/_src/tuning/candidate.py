"""One candidate config's state while it is tuned, and how failures are described."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from kerneltune._src.tuning.report import CandidateResult, Status


@dataclasses.dataclass
class Candidate:
    """A config on the bench: built, run once (validated), then sampled; `fail` ends
    it with a status and a reason."""

    index: int
    cfg: Any
    status: Status | None = None  # None: not evaluated yet (or still compiling).
    submitted: bool = False
    compiled: Any = None
    error: str | None = None
    compile_s: float | None = None
    lower_s: float | None = None
    rel_error: float | None = None
    per_call_s: float | None = None  # estimate from the warm-up, refined by samples
    calls: int = 1
    samples: list[float] = dataclasses.field(default_factory=list)
    output: Any = None  # kept for the reference only
    ran: bool = False  # the warm-up ran and was validated
    target: int = 0  # samples wanted by the search
    dropped: bool = False  # clearly slow: no more samples

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
            lower_s=self.lower_s,
        )


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
