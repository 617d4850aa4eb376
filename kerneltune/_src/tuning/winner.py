"""Deciding the winner: the best few re-measured side by side, then `fastest` (the
default `decide`), which prefers the heuristic config within the noise band."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from kerneltune._src.tuning.bench import Bench
from kerneltune._src.tuning.candidate import Candidate
from kerneltune._src.tuning.report import CandidateResult

#: Picks the winner's index from every candidate's result (None: no winner).
Decide = Callable[[Sequence[CandidateResult]], "int | None"]

#: Medians closer than this fraction are a tie: run-to-run noise on a GPU is about 1%.
NOISE_BAND = 0.02


def fastest(results: Sequence[CandidateResult]) -> int | None:
    """The default `decide`: the candidate with the lowest median time, where times
    measurably no slower than the lowest count as a tie that goes to the earliest
    candidate. Measurably: within `NOISE_BAND` of the lowest, or within twice the
    uncertainty of the difference of the two medians (from each one's samples, where
    it has four or more), whichever is wider: on a loaded machine's wall clock a 10 us
    kernel's samples scatter by far more than 2%, and more samples narrow the band.

    The selection chain puts the kernel's heuristic config first, so tuning replaces
    the heuristic only with a config measurably faster than it; other ties go to the
    candidates' order, so the choice is deterministic.
    """
    ok = [
        (i, r.time_s, _median_error(r.samples_s))
        for i, r in enumerate(results)
        if r.ok and r.time_s is not None
    ]
    if not ok:
        return None
    _, lowest, lowest_error = min(ok, key=lambda row: row[1])
    return next(i for i, t, error in ok if ties(t, lowest, math.hypot(error, lowest_error)))


def ties(t: float, lowest: float, uncertainty: float = 0.0) -> bool:
    """A time `t` is measurably no slower than `lowest`: within `NOISE_BAND` of it, or
    within twice the `uncertainty` of their difference, whichever is wider."""
    return t - lowest <= max(lowest * NOISE_BAND, 2 * uncertainty)


def _median_error(samples: Sequence[float]) -> float:
    """The standard error of the samples' median, from their median absolute deviation
    (robust: a few samples slowed by a descheduled process barely move it); 0 with
    fewer than four samples."""
    if len(samples) < 4:
        return 0.0
    middle = statistics.median(samples)
    mad = statistics.median(abs(t - middle) for t in samples)
    # MAD x 1.4826 estimates the standard deviation; the median's error is 1.2533 x
    # that over the square root of the count (normal noise).
    return 1.4826 * 1.2533 * mad / math.sqrt(len(samples))


def remeasure_best(bench: Bench, top_k: int, iters: int) -> None:
    """The best few, side by side, with more samples: a winner decided by a few
    samples taken at different times can be a lucky one."""
    # Judged slow on inflated samples? Then it competes with the best few again.
    back = bench.confirm_slow()
    if top_k < 2 or iters < 1:
        return
    ranked = sorted((c for c in bench.cands if c.median is not None), key=_median)
    top: list[Candidate] = ranked[:top_k]
    top += [c for c in back if c not in top]
    if len(top) < 2:
        return
    ref = bench.reference
    if ref is not None and ref.ok and ref not in top:
        top.append(ref)  # its time is the baseline of the reported speedup
    bench.sample(top, iters)


def _median(c: Candidate) -> float:
    return c.median  # type: ignore[return-value]
