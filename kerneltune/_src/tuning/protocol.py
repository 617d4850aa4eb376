"""How the selection chain drives a tuner: kerneltune's `Tuner`, a subclass of it, or
any object with the documented protocol `autotune(make_fn, args, kwargs, candidates)`.

The chain wants a full `TuningReport` (every candidate's time, for caches and
reports), which `Tuner.tune` gives. A tuner that brings its own `autotune` (and not its
own `tune`) is called through `autotune`, so its decision is the one that counts; its
report holds the winner only.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kerneltune._src.tuning.report import CandidateResult, TuningReport
from kerneltune._src.tuning.tuner import Tuner

logger = logging.getLogger("kerneltune")


def uses_own_autotune(tuner: Any) -> bool:
    """Whether `tuner`'s decision comes from its own `autotune` rather than `tune`."""
    cls = type(tuner)
    own_tune = getattr(cls, "tune", None)
    own_autotune = getattr(cls, "autotune", None)
    if own_tune is None:
        return own_autotune is not None
    return own_tune is Tuner.tune and own_autotune not in (None, Tuner.autotune)


def _takes(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def run_tuner(
    tuner: Any,
    make_fn: Callable[[Any], Callable[..., Any]],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    candidates: Sequence[Any],
    *,
    reference_cfg: Any,
    backward: bool,
    name: str,
    reference_fn: Callable[..., Any] | None = None,
    hints: Sequence[Any] = (),
    compiles_at_once: int | None = None,
    log_summary: bool = True,
) -> TuningReport:
    """Tunes one key with `tuner`; a tuner's failure to pick any config is a report
    whose `best` is None (the chain then falls back to the heuristic). `hints` (the
    winners at neighbouring shapes) and `compiles_at_once` (`Tuner.tune`) reach a
    `tune` that takes them. `log_summary`: log the report's one-line summary, whatever
    the tuner (False where the caller logs the key's final report itself)."""
    if uses_own_autotune(tuner):
        report = _own_autotune(tuner, make_fn, args, kwargs, candidates, reference_cfg, name)
    else:
        extra: dict[str, Any] = {}
        if _takes(tuner.tune, "log_summary"):
            extra["log_summary"] = False  # logged below, whatever the tuner
        if reference_fn is not None:
            extra["reference_fn"] = reference_fn
        if hints and _takes(tuner.tune, "hints"):
            extra["hints"] = list(hints)
        if compiles_at_once is not None and _takes(tuner.tune, "compiles_at_once"):
            extra["compiles_at_once"] = compiles_at_once
        report = tuner.tune(
            make_fn,
            args,
            kwargs,
            candidates,
            reference_cfg=reference_cfg,
            backward=backward,
            name=name,
            **extra,
        )
    if log_summary:
        logger.info("%s", report.summary())
    return report


def _own_autotune(
    tuner: Any,
    make_fn: Callable[[Any], Callable[..., Any]],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    candidates: Sequence[Any],
    reference_cfg: Any,
    name: str,
) -> TuningReport:
    """A report of a tuner that only picks, through its own `autotune`."""
    start = time.perf_counter()
    strategy = f"{type(tuner).__name__}.autotune"
    try:
        best = tuner.autotune(make_fn, args, kwargs, list(candidates))
    except Exception as e:  # reported as the failure of every candidate
        error = f"{type(e).__name__}: {e}"
        results = tuple(CandidateResult(cfg=c, status="run_error", error=error) for c in candidates)
        return TuningReport(
            best=None, candidates=results, timer="custom", strategy=strategy, name=name
        )
    results = tuple(
        CandidateResult(cfg=c, status="ok" if c == best else "pruned") for c in candidates
    )
    if best not in candidates:
        results += (CandidateResult(cfg=best, status="ok"),)
    return TuningReport(
        best=best,
        candidates=results,
        timer="custom",
        heuristic_cfg=reference_cfg,
        wall_s=time.perf_counter() - start,
        strategy=strategy,
        name=name,
    )
