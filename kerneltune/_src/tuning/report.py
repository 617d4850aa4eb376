"""What a tuning run produces: one result per candidate and the winner.

This is the contract between the selection chain (which asks for a tuning) and the
tuning engine (which times candidates): the chain stores and reports these objects, it
never looks inside the engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Status = Literal["ok", "compile_error", "run_error", "timeout", "oom", "invalid", "pruned"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CandidateResult:
    """One candidate's outcome.

    Attributes:
      cfg: the candidate config.
      status: "ok" when it compiled, ran and validated; otherwise why it was dropped.
      time_s: its median time per call in seconds (None unless status is "ok").
      samples_s: every timed sample in seconds, warm-up excluded.
      error: the error message for failed candidates.
      compile_s: how long compiling it took.
    """

    cfg: Any
    status: Status = "ok"
    time_s: float | None = None
    samples_s: tuple[float, ...] = ()
    error: str | None = None
    compile_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.time_s is not None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuningReport:
    """The result of tuning one key.

    Attributes:
      best: the winning config, or None when every candidate failed.
      candidates: every candidate's result, in the order they were given.
      timer: which timer measured them (e.g. "cupti", "wallclock").
      heuristic_cfg: the config the winner is compared with (may be None).
      heuristic_time_s: the heuristic config's median time, when it was timed.
      wall_s: how long the whole tuning took.
      strategy: the search strategy used (e.g. "exhaustive").
    """

    best: Any
    candidates: tuple[CandidateResult, ...]
    timer: str
    heuristic_cfg: Any = None
    heuristic_time_s: float | None = None
    wall_s: float = 0.0
    strategy: str = "exhaustive"

    @property
    def best_time_s(self) -> float | None:
        times = [c.time_s for c in self.candidates if c.ok and c.cfg == self.best]
        return min(times) if times else None  # type: ignore[type-var]

    @property
    def failures(self) -> tuple[CandidateResult, ...]:
        return tuple(c for c in self.candidates if not c.ok)

    @property
    def speedup(self) -> float | None:
        """Heuristic time over the winner's time (>1 means tuning paid off)."""
        best = self.best_time_s
        if best is None or not self.heuristic_time_s:
            return None
        return self.heuristic_time_s / best
