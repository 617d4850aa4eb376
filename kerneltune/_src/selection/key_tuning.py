"""Tuning one key for the selection chain: the heuristic first in line, inputs made
outside any trace, a warm start from tuned neighbours, every process agreeing."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from kerneltune._src.caching.cache import CacheKey
from kerneltune._src.core import scope, tracing
from kerneltune._src.kernel import dispatch, hooks
from kerneltune._src.kernel.base import Invocation, Kernel
from kerneltune._src.kernel.methods import bound, methods_of
from kerneltune._src.selection import training_keys
from kerneltune._src.tuning import distributed, shared
from kerneltune._src.tuning.protocol import run_tuner
from kerneltune._src.tuning.report import TuningReport

logger = logging.getLogger("kerneltune")


def tune_key(
    inv: Invocation[Any, Any],
    kernel: Kernel[Any, Any],
    key: CacheKey,
    candidates: list[Any],
    *,
    tuner: Any,
    backward: bool,
    hints: list[Any],
    emit: Callable[..., None],
    space: int | None = None,
    in_order: bool = False,
) -> TuningReport:
    """Benchmarks `candidates` for `inv` and returns the report every process agrees
    on; `emit(event, key, **data)` reports "autotune_start" and "autotune_finish".

    `space`: under a first-call budget, how many configs a full search would time
    (`candidates` are the shortlist): the report is marked `budgeted` when the
    shortlist is smaller, or some of it did not run in time.

    `in_order`: time `candidates` in the order given (a first call's shortlist, the
    predicted choice first: a budget that runs out times only the first few); by
    default the heuristic goes first."""
    heuristic = hooks.find_heuristic(kernel, inv)
    if heuristic is not None and not in_order:
        # Never worse than not tuning: the heuristic is a contender, first in line,
        # so only a config measurably faster replaces it (ties go to the first).
        candidates = [heuristic, *(c for c in candidates if c != heuristic)]
    context = hooks.context_of(inv)

    # An object, not a closure: it pickles, so worker processes can lower candidates.
    make_fn = dispatch.KernelFunction(kernel, context)

    backward = backward and not scope.current().forward_only
    # In a shared tuning each process times a slice (the heuristic and hints in all).
    timed = shared.shared_slice(candidates, keep=[c for c in (heuristic, *hints) if c is not None])
    emit(
        "autotune_start",
        key,
        candidates=list(candidates),
        backward=backward,
        hints=hints,
        timed=len(timed),
    )
    # The call may be inside a jit trace: build inputs and time candidates outside
    # it, or every array made here would be a tracer of the user's program.
    with tracing.outside_traces():
        args, kwargs = hooks.concrete_inputs(kernel, inv)

        def tune(
            cands: list[Any], *, backward: bool, hints: list[Any], reference_cfg: Any
        ) -> TuningReport:
            # Mostly Mosaic GPU candidates compile one at a time: a search that pads
            # its batches to the compile threads would pay for every padded config.
            alone = sum(hooks.compiles_one_at_a_time(kernel, c) for c in cands)
            return run_tuner(
                tuner,
                make_fn,
                args,
                kwargs,
                cands,
                reference_cfg=reference_cfg,
                backward=backward,
                name=f"{inv.op_id_v}({inv.signature})",
                reference_fn=bound(kernel, methods_of(kernel, context).reference),
                hints=hints,
                compiles_at_once=1 if 2 * alone > len(cands) else None,
                log_summary=False,  # one line per key, for the report agreed on below
            )

        report: TuningReport | None = None
        # A full search, by this process alone: candidates whose backward is the same
        # kernels whatever their config are timed forward only (`training_keys`). A
        # budgeted first call (a shortlist of a few) and a shared tuning (slices
        # merged across processes) time every candidate with its backward.
        if backward and space is None and not shared.active():
            report = training_keys.tune_in_two(
                tune,
                timed,
                apart=lambda cfg: hooks.backward_tuned_apart(kernel, cfg),
                heuristic=heuristic,
                hints=hints,
            )
        if report is None:
            report = tune(timed, backward=backward, hints=hints, reference_cfg=heuristic)
    # With several processes, every one must end with the same winner (SPMD).
    if shared.active():
        report = shared.agree(key, report, candidates)
    else:
        report = distributed.agree(key, report)
    if space is not None:
        late = any(c.status == "pruned" for c in report.candidates)
        report = dataclasses.replace(report, budgeted=len(candidates) < space or late)
    logger.info("%s", report.summary())
    emit(
        "autotune_finish",
        key,
        cfg=report.best,
        report=report,
        timings=[(c.cfg, c.time_s, c.status) for c in report.candidates],
    )
    return report
