"""Search strategies: which candidates to compile and time, in what order.

A strategy drives an `Evaluator` (the tuner's bench): it asks for candidates to be
evaluated and reads back their median times. It never picks the winner itself: after
the search the tuner re-measures the best few side by side and decides.

- `Exhaustive`: every candidate. The default for small spaces.
- `CoordinateDescent`: starts from the heuristic config and a spread-out sample, then
  repeatedly evaluates the neighbours of the best config found so far (configs that
  differ in one field, then in two) until none is faster or the budget is spent.
  Compiles a fraction of the space, which is what costs most on a GPU.
- `SuccessiveHalving`: compiles everything, times each candidate briefly, and spends
  more samples only on the fastest third, then the fastest third of those. For spaces
  where timing (slow kernels), not compiling, is the cost.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Evaluator(Protocol):
    """What a strategy may ask of the tuner."""

    @property
    def candidates(self) -> Sequence[Any]:
        """Every candidate config, in the order given to the tuner."""
        ...

    @property
    def reference_index(self) -> int | None:
        """The position of the heuristic (reference) config among the candidates."""
        ...

    @property
    def workers(self) -> int:
        """How many candidates compile at once: batches of this size cost about as
        much wall time as one."""
        ...

    def evaluate(
        self, indices: Sequence[int], rounds: int | None = None
    ) -> dict[int, float | None]:
        """Compiles, validates and times the candidates at `indices` and returns the
        median seconds of each one evaluated (None when it failed). Candidates beyond
        the budget are left out of the result."""
        ...

    def exhausted(self) -> bool:
        """True when the evaluation or time budget is spent."""
        ...


@runtime_checkable
class SearchStrategy(Protocol):
    """Decides which candidates the tuner evaluates."""

    name: str

    def search(self, ev: Evaluator) -> None: ...


@dataclasses.dataclass(frozen=True)
class Exhaustive:
    """Evaluates every candidate (within the tuner's budget, in the given order)."""

    name: str = "exhaustive"

    def search(self, ev: Evaluator) -> None:
        ev.evaluate(range(len(ev.candidates)))


@dataclasses.dataclass(frozen=True)
class SuccessiveHalving:
    """Times every candidate with one round, then keeps the fastest `1/eta` for more
    rounds (doubling each time) until `keep` remain.

    Args:
      eta: the fraction kept at each step is 1/eta.
      keep: stop when this many candidates remain.
    """

    eta: int = 3
    keep: int = 3
    name: str = "halving"

    def search(self, ev: Evaluator) -> None:
        if self.eta < 2 or self.keep < 1:
            raise ValueError(f"SuccessiveHalving needs eta >= 2 and keep >= 1, got {self}.")
        times = ev.evaluate(range(len(ev.candidates)), rounds=1)
        alive = _ranked(times)
        rounds = 1
        while len(alive) > self.keep and not ev.exhausted():
            alive = alive[: max(self.keep, math.ceil(len(alive) / self.eta))]
            rounds *= 2
            times.update(ev.evaluate(alive, rounds=rounds))
            alive = _ranked({i: times[i] for i in alive})


@dataclasses.dataclass(frozen=True)
class CoordinateDescent:
    """Local search over the config's fields.

    Configs are dataclasses or mappings; a candidate's neighbours are the candidates
    that differ from it in one field (radius 1) or two (radius 2). Starting from the
    heuristic config plus `initial` candidates spread across the space, it moves to the
    best config found and evaluates its unseen neighbours in one batch (they compile in
    parallel), widening to radius 2 when radius 1 holds nothing faster.

    Args:
      initial: how many spread-out candidates to start from (default: enough to keep
        every compile thread busy once, at most a tenth of the space, at least 4).
      max_evals: stop after this many candidates (default: `fraction` of the space).
      fraction: the default budget as a fraction of the space.
      max_radius: how many fields may change at once when looking for a better config.
      min_gain: a neighbour must be this much faster (relative) to move to it, so noise
        does not make the search wander.
      seed: for the spread-out sample and the order of radius-2 neighbours.
    """

    initial: int | None = None
    max_evals: int | None = None
    fraction: float = 0.3
    max_radius: int = 2
    min_gain: float = 0.01
    seed: int = 0
    name: str = "coordinate"

    def search(self, ev: Evaluator) -> None:
        cands = list(ev.candidates)
        n = len(cands)
        points = [config_point(c) for c in cands]
        budget = self.max_evals if self.max_evals is not None else max(1, round(self.fraction * n))
        budget = min(n, max(budget, 1))
        rng = random.Random(self.seed)
        initial = self.initial
        if initial is None:
            initial = min(ev.workers, max(4, n // 10))
        start = ev.reference_index
        first = spread_sample(points, max(1, min(initial, budget)), start=start, rng=rng)
        times: dict[int, float | None] = dict(ev.evaluate(first))
        best = _best(times)
        while best is None and len(times) < min(budget, n) and not ev.exhausted():
            # Everything so far failed (e.g. blocks too large for this shape): look
            # elsewhere before giving up.
            rest = [i for i in range(n) if i not in times]
            more = spread_sample(
                [points[i] for i in rest], min(initial, budget - len(times)), rng=rng
            )
            times.update(ev.evaluate([rest[j] for j in more]))
            best = _best(times)
        radius = 1
        while best is not None and len(times) < budget and not ev.exhausted():
            unseen = [i for i in neighbours(points, best, radius) if i not in times]
            if radius > 1:
                rng.shuffle(unseen)
            unseen = unseen[: budget - len(times)]
            if unseen:
                times.update(ev.evaluate(unseen))
            new_best = _best(times)
            moved = (
                new_best is not None
                and new_best != best
                and times[new_best] < times[best] * (1 - self.min_gain)  # type: ignore[operator]
            )
            if moved:
                best, radius = new_best, 1
            elif radius < self.max_radius:
                radius += 1
            else:
                break


def config_point(cfg: Any) -> tuple[tuple[str, Any], ...]:
    """A config as a tuple of (field, value) pairs; configs that are neither
    dataclasses nor mappings are one field, "cfg"."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        items = [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg)]
    elif isinstance(cfg, Mapping):
        items = sorted((str(k), v) for k, v in cfg.items())
    elif hasattr(cfg, "_asdict"):
        items = list(cfg._asdict().items())
    else:
        items = [("cfg", cfg)]
    return tuple((k, _hashable(v)) for k, v in items)


def _hashable(v: Any) -> Any:
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


def _distance(a: tuple[tuple[str, Any], ...], b: tuple[tuple[str, Any], ...]) -> int:
    if len(a) != len(b):
        return max(len(a), len(b))
    return sum(1 for x, y in zip(a, b) if x != y)


def neighbours(points: Sequence[tuple[tuple[str, Any], ...]], at: int, radius: int) -> list[int]:
    """Indices of the candidates that differ from `points[at]` in exactly `radius`
    fields."""
    return [i for i, p in enumerate(points) if _distance(p, points[at]) == radius]


def spread_sample(
    points: Sequence[tuple[tuple[str, Any], ...]],
    k: int,
    *,
    start: int | None = None,
    rng: random.Random | None = None,
) -> list[int]:
    """`k` indices spread across the space: each next pick is as far (in changed
    fields) as possible from those already picked; ties are broken at random."""
    rng = rng or random.Random(0)
    n = len(points)
    if k >= n:
        return list(range(n))
    chosen = [start if start is not None else rng.randrange(n)]
    nearest = [_distance(p, points[chosen[0]]) for p in points]
    while len(chosen) < k:
        far = max(nearest)
        options = [i for i in range(n) if nearest[i] == far and i not in chosen]
        pick = rng.choice(options)
        chosen.append(pick)
        nearest = [min(d, _distance(p, points[pick])) for d, p in zip(nearest, points)]
    return chosen


def _ranked(times: Mapping[int, float | None]) -> list[int]:
    return sorted((i for i, t in times.items() if t is not None), key=lambda i: times[i])  # type: ignore[arg-type, return-value]


def _best(times: Mapping[int, float | None]) -> int | None:
    ranked = _ranked(times)
    return ranked[0] if ranked else None


#: Spaces up to this size are searched exhaustively unless a budget says otherwise.
EXHAUSTIVE_MAX = 128

STRATEGIES = ("auto", "exhaustive", "coordinate", "halving")


def resolve_strategy(
    spec: str | SearchStrategy, num_candidates: int, max_evals: int | None
) -> SearchStrategy:
    """The strategy for `spec`: a name from `STRATEGIES` or a `SearchStrategy`.

    "auto" is exhaustive for spaces of at most `EXHAUSTIVE_MAX` candidates that fit the
    evaluation budget, coordinate descent otherwise.

    Raises:
      ValueError: `spec` is an unknown name.
    """
    if not isinstance(spec, str):
        if not isinstance(spec, SearchStrategy):
            raise ValueError(
                f"strategy must be one of {STRATEGIES} or a SearchStrategy, got {spec!r}."
            )
        return spec
    if spec == "auto":
        fits = max_evals is None or max_evals >= num_candidates
        spec = "exhaustive" if num_candidates <= EXHAUSTIVE_MAX and fits else "coordinate"
    if spec == "exhaustive":
        return Exhaustive()
    if spec == "coordinate":
        return CoordinateDescent(max_evals=max_evals)
    if spec == "halving":
        return SuccessiveHalving()
    raise ValueError(f"strategy must be one of {STRATEGIES} or a SearchStrategy, got {spec!r}.")
