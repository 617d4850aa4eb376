"""The settings one tuning's bench runs with (what `Tuner` passes down)."""

from __future__ import annotations

import dataclasses
from typing import Any

from kerneltune._src.tuning import search, timing


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
    abandon_late: bool = False  # at the deadline, abandon candidates not yet run
    first_grace_s: float = 0.0  # ...but the first candidate, this much later
    # Candidates that compile in the wall time of one: max_workers, or 1 where the
    # process compiles its kernels one at a time (Mosaic GPU).
    compiles_at_once: int | None = None


def check_tuner_arguments(
    *,
    warmup: Any,
    iters: Any,
    top_k: Any,
    max_evals: Any,
    remeasure_iters: Any,
    max_workers: Any,
    time_budget_s: Any,
    compile_timeout_s: Any,
    run_timeout_s: Any,
    target_sample_s: Any,
    drop_factor: Any,
    strategy: Any,
    timer: Any,
    first_grace_s: Any = None,
) -> None:
    """Raises a ValueError naming the first `Tuner` argument out of its range."""
    check_int("warmup", warmup, 0)
    check_int("iters", iters, 1)
    check_int("top_k", top_k, 0)
    if max_evals is not None:
        check_int("max_evals", max_evals, 1)
    if remeasure_iters is not None:
        check_int("remeasure_iters", remeasure_iters, 0)
    if max_workers is not None:
        check_int("max_workers", max_workers, 1)
    for name, value in (
        ("time_budget_s", time_budget_s),
        ("compile_timeout_s", compile_timeout_s),
        ("run_timeout_s", run_timeout_s),
        ("target_sample_s", target_sample_s),
        ("drop_factor", drop_factor),
    ):
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"Tuner({name}=...) must be a positive number or None, got {value!r}.")
    if first_grace_s is not None and not (
        isinstance(first_grace_s, (int, float)) and first_grace_s >= 0
    ):
        raise ValueError(
            f"Tuner(first_grace_s=...) must be a number >= 0 or None, got {first_grace_s!r}."
        )
    if isinstance(strategy, str) and strategy not in search.STRATEGIES:
        raise ValueError(
            f"Tuner(strategy=...) must be one of {search.STRATEGIES} or a SearchStrategy, "
            f"got {strategy!r}."
        )
    timing.choose_timer(timer) if isinstance(timer, str) and timer == "wallclock" else None
    if isinstance(timer, str) and timer not in ("auto", "cupti", "wallclock"):
        raise ValueError(
            f"Tuner(timer=...) must be 'auto', 'cupti', 'wallclock' or a Timer, got {timer!r}."
        )


def check_int(
    name: str, value: Any, minimum: int, *, where: str = "Tuner", optional: bool = False
) -> None:
    """Raises a ValueError naming `where(name=...)` unless `value` is an integer (not a
    bool) >= `minimum`, or None where `optional`."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = f"an integer >= {minimum}{' or None' if optional else ''}"
        raise ValueError(f"{where}({name}=...) must be {allowed}, got {value!r}.")
