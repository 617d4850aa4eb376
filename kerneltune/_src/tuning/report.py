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
      compile_s: how long building it took (tracing, lowering and compiling).
      rel_error: its output's relative error ‖out − ref‖/‖ref‖ against the reference
        config's output (None when it was not validated).
      calls_per_sample: how many calls each sample averaged over (the last value; it
        adapts to the kernel's duration).
      lower_s: of `compile_s`, how long tracing and lowering took (the part that holds
        Python's GIL; None when it did not finish).
    """

    cfg: Any
    status: Status = "ok"
    time_s: float | None = None
    samples_s: tuple[float, ...] = ()
    error: str | None = None
    compile_s: float | None = None
    rel_error: float | None = None
    calls_per_sample: int | None = None
    lower_s: float | None = None

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
      name: what was tuned (for logs), e.g. "matmul@v1 f32[128,256], f32[256,64]".
      timer_note: why the preferred device timer was not used, when it was not.
      validated: whether outputs were compared with a reference output.
      validated_by: what they were compared with: "the reference implementation" (the
        op's math in plain JAX, which the kernel declares), "the heuristic config",
        "the majority of candidates (k of n agree)" when neither was available, or ""
        when they could not be (a warning said so).
      phases_s: where the wall time went: "setup" (before the first compile started),
        "compile" (while candidates compiled; with a device timer, samples were taken
        meanwhile), "timing" (samples after the compiles, the re-measurement of the best
        few included), "finish" (deciding and cleaning up), "total".
      budgeted: the search was cut short by a first-call budget (`FirstCallBudget`):
        only the configs a prediction ranked best were timed, or the time ran out
        before every candidate was. A full tuning of the key completes it.
    """

    best: Any
    candidates: tuple[CandidateResult, ...]
    timer: str
    heuristic_cfg: Any = None
    heuristic_time_s: float | None = None
    wall_s: float = 0.0
    strategy: str = "exhaustive"
    name: str = ""
    timer_note: str | None = None
    validated: bool = False
    validated_by: str = ""
    phases_s: dict[str, float] = dataclasses.field(default_factory=dict)
    budgeted: bool = False

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

    @property
    def num_evaluated(self) -> int:
        """Candidates that were compiled and run (not pruned by the search)."""
        return sum(1 for c in self.candidates if c.status != "pruned")

    @property
    def num_failed(self) -> int:
        """Candidates that were evaluated and failed (pruned ones are not failures)."""
        return sum(1 for c in self.candidates if not c.ok and c.status != "pruned")

    def describe_failures(self, limit: int = 5) -> str:
        """One line naming why candidates failed, for the warning given when every
        candidate failed (e.g. "3 of 3 candidates failed: compile_error ×2, run_error ×1;
        Cfg(bm=64): ValueError: ...")."""
        failed = [c for c in self.candidates if not c.ok and c.status != "pruned"]
        if not failed:
            return "no candidate failed"
        counts: dict[str, int] = {}
        for c in failed:
            counts[c.status] = counts.get(c.status, 0) + 1
        kinds = ", ".join(f"{status} ×{n}" for status, n in sorted(counts.items()))
        examples = "; ".join(f"{c.cfg}: {c.error or c.status}" for c in failed[:limit])
        more = f"; … and {len(failed) - limit} more" if len(failed) > limit else ""
        return (
            f"{len(failed)} of {self.num_evaluated} candidates failed ({kinds}): {examples}{more}"
        )

    def summary(self) -> str:
        """The one-line summary logged for each tuned key."""
        what = self.name or "kernel"
        tried, failed = self.num_evaluated, self.num_failed
        if self.best is None:
            return f"tuned {what}: no winner; {self.describe_failures()} [timer={self.timer}]"
        best = self.best_time_s
        speedup = self.speedup
        vs = f", {speedup:.2f}x over the heuristic" if speedup is not None else ""
        return (
            f"tuned {what}: {self.best} at {format_seconds(best, '?')}{vs}; {tried} tried, {failed} "
            f"failed, {len(self.candidates) - tried} pruned; timer={self.timer}, "
            f"strategy={self.strategy}, {self.wall_s:.2f} s"
        )


def format_seconds(seconds: float | None, missing: str = "-") -> str:
    """A duration with three significant digits in s, ms or us (`missing` for None): the
    one time format of reports, tables and logs.

    Example:
      >>> format_seconds(0.00123), format_seconds(2.5), format_seconds(4e-6)
      ('1.23 ms', '2.50 s', '4 us')
    """
    if seconds is None:
        return missing
    # The unit is chosen after rounding: 999.7 us shows as 1 ms, never as "1e+03 us".
    rounded = float(f"{seconds:.3g}")
    if rounded >= 1.0:
        return f"{seconds:.2f} s"
    if rounded >= 1e-3:
        return f"{rounded * 1e3:.3g} ms"
    return f"{rounded * 1e6:.3g} us"
