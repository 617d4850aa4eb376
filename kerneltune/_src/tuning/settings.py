"""The settings one tuning's bench runs with (what `Tuner` passes down)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """See `Tuner` for each field's meaning."""

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
    run_timeout_s: float | None = None  # None: from the heuristic's first run
