"""Tuning a training key in two stages, when some candidates share one backward.

A key under a gradient is timed forward + backward, since its config may pick the
backward too (XLA's and tokamax's backward come with their forward). But a Pallas
grouped matmul's backward is two kernels keyed and tuned for themselves, and the
attention kernel's is its backward kernel: whatever the forward config, the backward
is the same (`Backend.backward_tuned_apart`). Timing each such candidate with its
backward lowers and compiles the backward again per candidate, for a time that adds
the same amount to every one of them (a third of `kt.autotune`'s wall on an MoE layer).

So those candidates are searched forward only (stage one); the fastest of them is then
timed forward + backward beside the candidates whose backward is their own (stage
two). The backward's share, that candidate's two times apart, is added to every
forward-only time, so the report's times all mean forward + backward.

Stage two times the candidates with their own backward that a search of the whole
space would reach: with hints (the winners at neighbouring shapes), a warm search
starts from them and the heuristic and climbs among Pallas tiles, so only an
own-backward candidate among those; without hints, all of them. (Timing them all
regardless cost an MoE layer's `kt.autotune` 12-18 s a key on an H200:
`jax.lax.ragged_dot`'s dense lowering compiles in 11-23 s with its backward and took
9 GiB more, to lose 12-36x.)

When no such candidate is in reach, stage two is not run: it would time the fastest
shared candidate against nothing, and that candidate's backward is tuned at its own
keys anyway. The report's times are then forward only, and its strategy says so. (On
an MoE layer each forward key's second stage cost a reference compile, inputs and
first runs, seconds of `kt.autotune` that decided nothing.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from kerneltune._src.tuning.report import CandidateResult, TuningReport, format_seconds

#: `tune(candidates, *, backward, hints, reference_cfg) -> TuningReport`.
TuneFn = Callable[..., TuningReport]


def split(candidates: Sequence[Any], apart: Callable[[Any], bool]) -> tuple[list[Any], list[Any]]:
    """The candidates whose backward is tuned apart, and the others, in order."""
    shared = [c for c in candidates if apart(c)]
    own = [c for c in candidates if not apart(c)]
    return shared, own


def tune_in_two(
    tune: TuneFn,
    candidates: Sequence[Any],
    *,
    apart: Callable[[Any], bool],
    heuristic: Any,
    hints: Sequence[Any],
) -> TuningReport | None:
    """The key's report, its Pallas candidates timed forward only (see the module's
    docstring); None when the two stages cannot stand for one search (fewer than two
    candidates share the backward, or the fastest of them failed with its backward):
    the caller then times every candidate with its backward.

    `tune` runs the tuner on a candidate list; `apart(cfg)` says whether `cfg`'s
    backward is the same for all such configs."""
    shared, own = split(candidates, apart)
    if len(shared) < 2:
        return None
    first = tune(
        shared,
        backward=False,
        hints=[h for h in hints if h in shared],
        reference_cfg=heuristic if heuristic in shared else None,
    )
    fastest = first.best
    if fastest is None:
        return None
    if hints:
        own = [c for c in own if c == heuristic or c in hints]
    if not own:
        return forward_only(candidates, first)
    second = tune(
        [fastest, *own],
        backward=True,
        hints=[h for h in hints if h in own],
        reference_cfg=heuristic if heuristic in own else fastest,
    )
    forward_s = first.best_time_s  # `fastest` is `first.best`
    both_s = _time_of(second, fastest)
    if forward_s is None or both_s is None:
        return None
    return merged(candidates, first, second, fastest, max(0.0, both_s - forward_s), heuristic)


def merged(
    candidates: Sequence[Any],
    first: TuningReport,
    second: TuningReport,
    fastest: Any,
    backward_s: float,
    heuristic: Any,
) -> TuningReport:
    """One report of both stages, in the candidates' order: the second stage's results,
    and the first's with `backward_s` added to their times."""
    by_cfg: dict[Any, CandidateResult] = {}
    for c in first.candidates:
        by_cfg.setdefault(c.cfg, _plus(c, backward_s))
    for c in second.candidates:
        by_cfg[c.cfg] = c  # the fastest shared one: its own forward + backward time
    results = _in_order(candidates, by_cfg)
    heuristic_times = [
        r.time_s for r in results if r.time_s is not None and r.ok and r.cfg == heuristic
    ]
    phases = {
        k: first.phases_s.get(k, 0.0) + second.phases_s.get(k, 0.0)
        for k in {*first.phases_s, *second.phases_s}
    }
    shared_n = sum(1 for c in first.candidates if c.status != "pruned")
    strategy = (
        f"{first.strategy}, forward only for the {shared_n} candidates whose backward is "
        f"tuned apart (+{format_seconds(backward_s)} of backward, timed on {fastest}); "
        f"{second.strategy} forward + backward for the rest"
    )
    return dataclasses.replace(
        second,
        best=second.best,
        candidates=results,
        heuristic_cfg=heuristic,
        heuristic_time_s=min(heuristic_times) if heuristic_times else None,
        wall_s=first.wall_s + second.wall_s,
        strategy=strategy,
        validated=first.validated and second.validated,
        phases_s=phases,
    )


def forward_only(candidates: Sequence[Any], first: TuningReport) -> TuningReport:
    """Stage one's report as the key's, in the candidates' order, when no candidate
    with its own backward is in reach: its times are forward only."""
    return dataclasses.replace(
        first,
        candidates=_in_order(candidates, {c.cfg: c for c in first.candidates}),
        strategy=(
            f"{first.strategy}, forward only: every candidate in reach shares one backward, "
            "tuned at its own keys (not timed here)"
        ),
    )


def _time_of(report: TuningReport, cfg: Any) -> float | None:
    times = [c.time_s for c in report.candidates if c.ok and c.cfg == cfg]
    return min(times) if times else None  # type: ignore[type-var]


def _in_order(
    candidates: Sequence[Any], by_cfg: dict[Any, CandidateResult]
) -> tuple[CandidateResult, ...]:
    """The results in the candidates' order; a candidate no stage timed is not reached."""
    return tuple(by_cfg.get(c) or _not_reached(c) for c in candidates)


def _not_reached(cfg: Any) -> CandidateResult:
    # As a search leaves a candidate it does not reach.
    return CandidateResult(
        cfg=cfg, status="pruned", error="not reached: its backward is its own, and no hint"
    )


def _plus(result: CandidateResult, backward_s: float) -> CandidateResult:
    if not result.ok:
        return result
    return dataclasses.replace(
        result,
        time_s=result.time_s + backward_s,  # type: ignore[operator]
        samples_s=tuple(s + backward_s for s in result.samples_s),
    )
