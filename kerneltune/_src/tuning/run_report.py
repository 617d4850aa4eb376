"""What one tuning run reports once its search is over: the `TuningReport`, read from
the closed bench (every candidate's result, the timer, what validated the outputs,
where the time went), and the warnings owed to the caller (a winner chosen on
unvalidated outputs, timings taken on all-zero inputs)."""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from typing import Any

from kerneltune._src.tuning.bench import Bench
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.report import CandidateResult, TuningReport

logger = logging.getLogger("kerneltune")


@dataclasses.dataclass(frozen=True)
class Stamps:
    """`time.perf_counter()` when the tuning started, when its search started (the
    setup before it) and when the winner was decided (the finish after it)."""

    start: float
    searched: float
    finished: float


def warn_if_unvalidated(what: str, unvalidated: str, best: Any, progress: Progress) -> None:
    """Warns (from the tuner's caller) that a winner was chosen on time alone, with
    `unvalidated` saying why outputs could not be compared ("" when they were)."""
    if unvalidated and best is not None:
        warnings.warn(
            f"{what}: the candidates' outputs were not validated: {unvalidated}; "
            "the winner was chosen on time alone.",
            RuntimeWarning,
            stacklevel=4,
        )
        progress.close()


def log_if_all_zero(what: str, zeros: list[int] | None) -> None:
    """Logs the positions of float inputs that are all zeros (None or []: none are)."""
    if zeros:
        logger.warning(
            "Tuning %s on all-zero float inputs (positions %s): timings on zeros can "
            "flatter some configs; pass random data.",
            what,
            zeros,
        )


def report_of(
    bench: Bench,
    results: tuple[CandidateResult, ...],
    *,
    best: Any,
    timer: str,
    reference_cfg: Any,
    strategy: str,
    what: str,
    stamps: Stamps,
) -> TuningReport:
    """The report of a tuning whose bench is closed: `results` and `timer` were read
    from it before it closed."""
    end = time.perf_counter()
    start = stamps.start
    return TuningReport(
        best=best,
        candidates=results,
        timer=timer,
        heuristic_cfg=reference_cfg,
        heuristic_time_s=bench.reference_time(),
        wall_s=end - start,
        strategy=strategy,
        name=what,
        timer_note=bench.timer_note,
        validated=bool(bench.first_runs.validated_by),
        validated_by=bench.first_runs.validated_by,
        phases_s={
            "setup": stamps.searched - start,
            **bench.phases,
            "finish": end - stamps.finished,
            "total": end - start,
        },
    )
