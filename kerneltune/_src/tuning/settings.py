"""The settings one tuning's bench runs with (what `Tuner` passes down)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

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


def check_tuner_arguments(values: Mapping[str, Any]) -> None:
    """Raises a ValueError naming the first `Tuner` argument (`values`: by field name)
    out of its range: a bad value fails when the tuner is made, not inside a tuning."""
    check_int("warmup", values["warmup"], 0)
    check_int("iters", values["iters"], 1)
    check_int("top_k", values["top_k"], 0)
    if isinstance(values["seed"], bool) or not isinstance(values["seed"], int):
        raise ValueError(f"Tuner(seed=...) must be an integer, got {values['seed']!r}.")
    for name, least in (("max_evals", 1), ("remeasure_iters", 0), ("max_workers", 1)):
        check_int(name, values[name], least, optional=True)
    check_int("rotate_bytes", values["rotate_bytes"], 0, optional=True)
    for name in ("time_budget_s", "compile_timeout_s", "run_timeout_s", "target_sample_s"):
        value = values[name]
        if value is not None and not (_is_number(value) and value > 0):
            raise ValueError(f"Tuner({name}=...) must be a positive number or None, got {value!r}.")
    grace = values["first_grace_s"]
    if grace is not None and not (_is_number(grace) and grace >= 0):
        raise ValueError(f"Tuner(first_grace_s=...) must be a number >= 0 or None, got {grace!r}.")
    drop = values["drop_factor"]
    if drop is not None and not (_is_number(drop) and drop > 1):
        # At 1 or less the best candidate itself counts as clearly slow.
        raise ValueError(f"Tuner(drop_factor=...) must be a number > 1 or None, got {drop!r}.")
    for name in ("abandon_late", "validate"):
        if not isinstance(values[name], bool):
            raise ValueError(f"Tuner({name}=...) must be a bool, got {values[name]!r}.")
    if values["progress"] is not None and not isinstance(values["progress"], bool):
        raise ValueError(
            f"Tuner(progress=...) must be a bool or None (on a terminal), got "
            f"{values['progress']!r}."
        )
    if values["decide"] is not None and not callable(values["decide"]):
        raise ValueError(f"Tuner(decide=...) must be callable or None, got {values['decide']!r}.")
    _check_rtol(values["rtol"])
    strategy = values["strategy"]
    if isinstance(strategy, str):
        known = strategy in search.STRATEGIES
    else:
        known = isinstance(strategy, search.SearchStrategy)
    if not known:
        raise ValueError(
            f"Tuner(strategy=...) must be one of {search.STRATEGIES} or a SearchStrategy, "
            f"got {strategy!r}."
        )
    timer = values["timer"]
    if isinstance(timer, str):
        known = timer in ("auto", "cupti", "wallclock")
    else:
        known = isinstance(timer, timing.Timer)
    if not known:
        raise ValueError(
            f"Tuner(timer=...) must be 'auto', 'cupti', 'wallclock' or a Timer, got {timer!r}."
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_rtol(rtol: Any) -> None:
    """`rtol`: None, a number >= 0, or a mapping from dtypes (or their names) to such
    numbers (see `validate.tolerance`)."""
    if rtol is None:
        return
    items = rtol.items() if isinstance(rtol, Mapping) else [(None, rtol)]
    for key, value in items:
        if key is not None:
            try:
                np.dtype(key)
            except TypeError:
                raise ValueError(
                    f"Tuner(rtol=...) maps dtypes to tolerances; {key!r} is not a dtype."
                ) from None
        if not (_is_number(value) and value >= 0):
            raise ValueError(
                "Tuner(rtol=...) must be None, a number >= 0 or a mapping from dtype to "
                f"such a number, got {rtol!r}."
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
