"""Warm start: search from the configs that won at neighbouring shapes.

The best config of a call is usually the best, or one field away from the best, of the
same op at a nearby size (another sequence length, another batch). So instead of
sampling the whole space, a warm search evaluates the heuristic config, the neighbours'
winners and the configs one step from the nearest neighbour's winner (one field moved
to its next smaller or larger value), in one batch (one compile latency on a GPU),
filled up to the budget when the budget is no more than the configs that compile at
once; then it climbs: while a config one step from the best so far is faster, it moves
there. At a local optimum it widens once, to every config one field away; it stops
when that brings nothing, or when its budget (a quarter of the space by default) is
spent. When every
config it tried failed, it hands over to coordinate descent over the rest of the space.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kerneltune._src.tuning import config_space, search
from kerneltune._src.tuning.search import CoordinateDescent, Evaluator

#: Smaller spaces are searched whole even when neighbouring shapes give hints.
WARM_MIN_SPACE = 16


def may_warm_start(spec: Any, num_candidates: int) -> bool:
    """Whether a search of `num_candidates` with strategy `spec` would use hints (so a
    caller can skip gathering them when it would not)."""
    return spec == "auto" and num_candidates >= WARM_MIN_SPACE


def strategy_for(
    spec: str | search.SearchStrategy,
    candidates: Sequence[Any],
    hints: Sequence[Any],
    max_evals: int | None,
) -> search.SearchStrategy:
    """The search for one key: a warm start from `hints` (configs that won at
    neighbouring shapes, nearest first) when `spec` is "auto", some hint is a candidate
    and the space has at least `WARM_MIN_SPACE` candidates; else `spec` resolved by
    `search.resolve_strategy`."""
    starts = tuple(dict.fromkeys(candidates.index(h) for h in hints if h in candidates))
    if starts and may_warm_start(spec, len(candidates)):
        return WarmStart(starts, max_evals=max_evals)
    return search.resolve_strategy(spec, len(candidates), max_evals)


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """A local search started from hints.

    Args:
      hints: positions among the candidates of the configs that won at neighbouring
        shapes, the nearest neighbour's first.
      fraction: the budget as a fraction of the space (at least the first batch: the
        heuristic, the hints and the configs one step from the nearest winner).
      max_evals: the budget as a count; overrides `fraction`.
      min_gain: relative improvement a climbing step must bring to go on.
    """

    hints: tuple[int, ...]
    fraction: float = 0.25
    max_evals: int | None = None
    min_gain: float = 0.0
    name: str = "warm"

    def search(self, ev: Evaluator) -> None:
        points = [config_space.config_point(c) for c in ev.candidates]
        n = len(points)
        # At most a tenth of the space (at least 2): in a small space, hints crowd out
        # the climb.
        hints = [i for i in dict.fromkeys(self.hints) if 0 <= i < n][: max(2, n // 10)]
        if not hints:
            CoordinateDescent(max_evals=self.max_evals).search(ev)
            return
        steps = _Steps(points)
        reference = [] if ev.reference_index is None else [ev.reference_index]
        first = _unique([*reference, *hints, *steps.adjacent(hints[0])])
        budget = self.max_evals if self.max_evals is not None else round(self.fraction * n)
        budget = min(n, max(budget, len(first)))
        if budget <= ev.workers:
            # A batch no wider than the compile threads costs one compile latency, so
            # spending the whole budget at once costs no more wall time than its first
            # part, and it spares the climb's later batches, each a compile latency of
            # its own (1-3 s a Mosaic candidate: two batches a key were most of an MoE
            # layer's `kt.autotune`). It adds the configs one step from the other hints,
            # then one field from the nearest (benchmarks/warm_replay.py: same regret).
            more = [*(j for h in hints[1:] for j in steps.adjacent(h)), *steps.one_field(hints[0])]
            # The fraction rounded down, which the climb then keeps to: a padded first
            # batch and a climb of one more config would be two compile latencies.
            fill = self.max_evals if self.max_evals is not None else int(self.fraction * n)
            budget = max(len(first), min(budget, fill))
            first = _unique([*first, *more])[:budget]
        times = dict(ev.evaluate(first))
        best = _best(times)
        widened = False
        while best is not None and len(times) < budget and not ev.exhausted():
            # Climb by one step of one field; at a local optimum, widen once to every
            # config one field away (a jump of several steps), and climb on if it helps.
            near = steps.adjacent(best) if not widened else steps.one_field(best)
            step = [i for i in near if i not in times]
            if step:
                times.update(ev.evaluate(step[: budget - len(times)]))
            new_best = _best(times)
            if new_best != best and times[new_best] < times[best] * (1 - self.min_gain):  # type: ignore[index, operator]
                best, widened = new_best, False
            elif widened:
                break
            else:
                widened = True
        if best is None and len(times) < n and not ev.exhausted():
            # Every config near the hints failed (a shape they do not fit): search the rest.
            CoordinateDescent(max_evals=self.max_evals).search(ev)


class _Steps:
    """Moves in a config space: to the configs one field away, and among those to the
    ones one *step* away (the next smaller or larger value of a numeric field; any other
    value of a field that is not numeric)."""

    def __init__(self, points: Sequence[tuple[tuple[str, Any], ...]]) -> None:
        self.points = points
        ranks: dict[str, dict[Any, int]] = {}
        for name in {f for p in points for f, _ in p}:
            values = {v for p in points for f, v in p if f == name}
            numbers = sorted(v for v in values if _is_number(v))
            ranks[name] = {v: r for r, v in enumerate(numbers)}
        self.ranks = ranks

    def one_field(self, at: int) -> list[int]:
        return config_space.neighbours(self.points, at, 1)

    def adjacent(self, at: int) -> list[int]:
        here = dict(self.points[at])
        out = []
        for i in self.one_field(at):
            ((name, value),) = ((f, v) for f, v in self.points[i] if here.get(f) != v)
            rank = self.ranks.get(name, {})
            if value in rank and here[name] in rank and abs(rank[value] - rank[here[name]]) > 1:
                continue
            out.append(i)
        return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _unique(indices: Sequence[int]) -> list[int]:
    return list(dict.fromkeys(indices))


def _best(times: dict[int, float | None]) -> int | None:
    ok = [i for i, t in times.items() if t is not None]
    return min(ok, key=lambda i: times[i]) if ok else None  # type: ignore[arg-type, return-value]
