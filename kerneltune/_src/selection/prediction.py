"""A config predicted for a call before anything is timed, from tuned calls near it.

The tuned calls of the same op, dtypes and static arguments at other sizes (this
process's, the persistent cache's, the shipped tables'; `tuned_neighbours.timed_calls`)
recorded how much slower than their best each candidate ran. A candidate's predicted
slowdown at a new size is the average of its slowdowns at the `NEIGHBOURS` nearest of
those calls, each weighted by `DECAY` to the power of minus its distance (the summed
|log2| ratio of the sizes: a call twice as long in one dimension counts a quarter of
one of the same size), shrunk towards a prior (`PRIOR_SLOWDOWN`, with the weight of a
call `PRIOR_DISTANCE` away) so that one far call cannot carry a candidate alone. A
candidate that failed at a neighbour counts as `FAILED_SLOWDOWN` times slower there.
A candidate no neighbour measured is predicted at the prior alone: after the measured
ones expected to be faster than that, before the ones measured slower; among such
candidates the heuristic comes first, then the configs nearest it (fewest fields
changed). With no neighbour at all, the prediction is the heuristic, and the configs
one field from it are next. A kernel whose config fields mean different things at
different sizes matches them in terms that hold at any size
(`BackendKernel.config_across_sizes`: the loss head's chunk as long as the call is
"one chunk" at any length). Where the kernel models its tiles' waste
(`BackendKernel.padded_work`: the grouped matmuls), a tuned call's slowdown of a config
is carried here scaled by the config's work here over its work there (a failure
counts as it is): 128×256 tiles that fit 2048 columns exactly compute 9% more than the
1408 columns asked for.

Everything here is a pure function of the candidates, the heuristic and the tuned
calls, in an order fixed by their contents (never by the order a cache lists them), so
processes given the same data predict the same config.

The weights were chosen on the leave-one-out replay of the shipped tables
(`benchmarks/prediction_regret.py`): 4 neighbours, a decay of 4 and a prior of 1.5x at
distance 1 gave the lowest worst-case regret of the seven variants tried there.
Neighbours far away still decide: falling back to the heuristic where all of them were
far (weights below one call 6 apart) fixed the loss head's two far-apart keys in that
replay, but at a shape in no table, measured on an H100, it chose a config 37.6% behind
where the far neighbours' choice was the best (BENCHMARKS.md, 2026-12-06/07).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kerneltune._src.caching.cache_entry import plain
from kerneltune._src.caching.tuned_neighbours import TimedCall
from kerneltune._src.core import call_shapes
from kerneltune._src.core.configs import config_to_dict
from kerneltune._src.tuning import config_space

#: How many of the nearest tuned calls inform a prediction.
NEIGHBOURS = 4
#: A tuned call's weight is `DECAY ** -distance`.
DECAY = 4.0
#: Before any evidence, a candidate is taken to be this much slower than the best...
PRIOR_SLOWDOWN = 1.5
#: ...with the weight of a tuned call this far away.
PRIOR_DISTANCE = 1.0
#: A candidate that failed at a tuned call counts as this much slower than the best there.
FAILED_SLOWDOWN = 4.0


def config_id(cfg: Any) -> str:
    """A config's identity across types: its fields as sorted JSON (so a config and
    the field dict a cache file holds for it match); its repr when it has no fields."""
    try:
        return json.dumps(plain(config_to_dict(cfg)), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return repr(cfg)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The candidates of one call, predicted fastest first.

    Attributes:
      ranked: every candidate, predicted fastest first.
      slowdowns: for each of `ranked`, its predicted time over the best one's at the
        tuned calls nearby (None: no tuned call measured it).
      heuristic: the kernel's heuristic config (None when it has none).
      neighbours: the sizes of the tuned calls the prediction drew on, nearest first.
      borrowed_from: the other GPU models whose shipped tables those calls came from
        (`tuned_neighbours.timed_calls`: only where the call's own has none).
      rescaled: some of those calls' timings were carried here scaled by the kernel's
        model of its tiles' work (`padded_work`).
    """

    ranked: tuple[Any, ...]
    slowdowns: tuple[float | None, ...]
    heuristic: Any
    neighbours: tuple[tuple[int, ...], ...] = ()
    borrowed_from: tuple[str, ...] = ()
    rescaled: bool = False

    @property
    def best(self) -> Any:
        """The config to use untimed: the first ranked one when some tuned call measured
        it, else the heuristic (which is what the kernel would have used)."""
        return self.usable()[0]

    @property
    def informed(self) -> bool:
        """Some tuned call nearby timed some of the candidates: the ranking rests on
        measurements, not on the heuristic alone."""
        return any(s is not None for s in self.slowdowns)

    def usable(self) -> list[Any]:
        """The configs worth using untimed, in order: those some tuned call measured,
        predicted fastest first, up to the heuristic; then the heuristic."""
        out: list[Any] = []
        for cfg, slowdown in zip(self.ranked, self.slowdowns, strict=True):
            if self.heuristic is not None and cfg == self.heuristic:
                break
            if slowdown is not None:
                out.append(cfg)
        if self.heuristic is not None:
            out.append(self.heuristic)
        return out or list(self.ranked[:1])

    def shortlist(self, k: int) -> list[Any]:
        """What a first call times, in order: the first choice (`best`: the config
        predicted fastest where a tuned call nearby measured it, else the heuristic),
        then the heuristic and the other candidates predicted fastest, `k` besides the
        heuristic in all. The first choice leads because a budget that runs out times
        only the first few: on an H200 (BENCHMARKS.md, 2026-11-27) the grouped matmul's
        heuristic, timed first, was the only config timed at 128 and 64 experts and cost
        52% and 38% over the fastest, where the prediction's choice cost 7%."""
        first = self.best
        head = (
            [first]
            if self.heuristic is None or first == self.heuristic
            else [first, self.heuristic]
        )
        rest = [c for c in self.ranked if c not in head]
        size = k + (0 if self.heuristic is None else 1)
        return (head + rest)[: max(size, 1)]

    def describe(self) -> str:
        """One line: what the prediction drew on."""
        if not self.neighbours:
            return "no tuned call of this op and dtypes nearby: the heuristic first"
        sizes = ", ".join("x".join(map(str, s)) for s in self.neighbours)
        where = f" on {' and '.join(self.borrowed_from)}" if self.borrowed_from else ""
        scaled = ", their timings scaled by the tiles' padded work" if self.rescaled else ""
        return (
            f"predicted from {len(self.neighbours)} tuned call(s){where} nearest in size "
            f"({sizes}{scaled}): {self.best!r}"
        )


def predict(
    sizes: Sequence[int] | None,
    candidates: Sequence[Any],
    heuristic: Any,
    calls: Sequence[TimedCall],
    padded_work: Callable[[Any, Sequence[int]], float] | None = None,
    across_sizes: Callable[[Any, Sequence[int]], Any] | None = None,
) -> Prediction:
    """Ranks `candidates` for a call of `sizes` from the tuned `calls` of its family.

    Args:
      sizes: the call's sizes (`CallShape.sizes`); None: no neighbour can be near.
      candidates: the call's candidate configs.
      heuristic: the kernel's heuristic config, or None.
      calls: tuned calls of the same family (`tuned_neighbours.timed_calls`).
      padded_work: the kernel's model of the work a config does at some sizes over the
        call's own (`BackendKernel.padded_work`); a tuned call's slowdown of a config
        counts scaled by that work here over there. None: no model.
      across_sizes: the kernel's config as it compares across sizes
        (`BackendKernel.config_across_sizes`): a tuned call's configs count for the
        candidates they match so. None: configs match as they are.
    """

    def identity(cfg: Any, at: Sequence[int] | None) -> str:
        return config_id(cfg if across_sizes is None or at is None else across_sizes(cfg, at))

    near = [(d, call, _log_slowdowns(call, identity)) for d, call in _nearest(sizes, calls)]
    near = [(d, call, slow) for d, call, slow in near if slow]
    evidence = [(DECAY**-d, call.shape.sizes, slow) for d, call, slow in near]
    prior_w = DECAY**-PRIOR_DISTANCE
    here = config_space.config_point(heuristic) if heuristic is not None else None

    def work(cfg: Any, at: Sequence[int]) -> float:
        return 1.0 if padded_work is None else padded_work(cfg, at)

    rows, rescaled = [], False
    for i, cfg in enumerate(candidates):
        cid = identity(cfg, sizes)
        work_here = 1.0 if sizes is None else work(cfg, sizes)
        num, den, seen = prior_w * math.log(PRIOR_SLOWDOWN), prior_w, False
        for w, there, slow in evidence:
            if cid in slow:
                measured, timed = slow[cid]
                # A failure does not scale with the work: only a time does.
                if timed:
                    ratio = math.log(work_here / work(cfg, there))
                    measured, rescaled = measured + ratio, rescaled or ratio != 0.0
                num, den, seen = num + w * measured, den + w, True
        score = num / den
        moved = 0 if here is None else config_space.distance(config_space.config_point(cfg), here)
        is_heuristic = heuristic is not None and cfg == heuristic
        order = (score, not seen, moved, not is_heuristic, i)
        rows.append((order, cfg, math.exp(score) if seen else None))
    rows.sort(key=lambda r: r[0])
    return Prediction(
        ranked=tuple(r[1] for r in rows),
        slowdowns=tuple(r[2] for r in rows),
        heuristic=heuristic,
        neighbours=tuple(call.shape.sizes for _, call, _ in near),
        borrowed_from=tuple(sorted({c.borrowed_from for _, c, _ in near if c.borrowed_from})),
        rescaled=rescaled,
    )


def _nearest(
    sizes: Sequence[int] | None, calls: Sequence[TimedCall]
) -> list[tuple[float, TimedCall]]:
    """The `NEIGHBOURS` nearest calls of the same rank, nearest first (ties by size)."""
    if sizes is None:
        return []
    found = [
        (call_shapes.distance(sizes, c.shape.sizes), c.shape.sizes, c)
        for c in calls
        if len(c.shape.sizes) == len(sizes)
    ]
    found.sort(key=lambda t: (t[0], t[1]))
    return [(d, c) for d, _, c in found[:NEIGHBOURS]]


def _log_slowdowns(
    call: TimedCall, identity: Callable[[Any, Sequence[int]], str]
) -> Mapping[str, tuple[float, bool]]:
    """log(time / best time) of each candidate the call measured, by its `identity` at
    the call's sizes, and whether it is a time (failures count at `FAILED_SLOWDOWN`);
    only its winner, at 0, when no time is known."""
    sizes = call.shape.sizes
    times = [t for _, t in call.outcomes if t is not None]
    if not times:
        return {identity(call.winner, sizes): (0.0, False)} if call.winner is not None else {}
    best = min(times)
    out: dict[str, tuple[float, bool]] = {}
    for cfg, t in call.outcomes:
        slow = (math.log(FAILED_SLOWDOWN), False) if t is None else (math.log(t / best), True)
        out.setdefault(identity(cfg, sizes), slow)
    return out
