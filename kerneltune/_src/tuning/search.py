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
import itertools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


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

    @property
    def name(self) -> str:
        """Recorded in the report (e.g. "exhaustive")."""
        ...

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
    """Local search over the config's fields, guided by a simple model.

    Configs are dataclasses or mappings; a candidate's neighbours are the candidates
    that differ from it in one field (radius 1) or two (radius 2). It starts from the
    heuristic config plus `initial` candidates spread across the space, then evaluates
    batches (they compile in parallel) of unseen neighbours of the best few configs
    found so far, most promising first, widening to radius 2 around the best when a
    batch brings no improvement; neighbours of the best configs of other regions and
    the configs a small model (log-time ≈ effects of field values and of pairs of
    values, fitted to every result so far) predicts fastest fill the rest of a batch,
    most promising first. It stops after
    `patience` batches without improvement, or when the budget is spent.

    Args:
      initial: how many spread-out candidates to start from (default: at most a tenth of
        the space, at least 4, at most the compile threads).
      max_evals: stop after this many candidates (default: `fraction` of the space).
      fraction: the default budget as a fraction of the space.
      batch: candidates per step (default: the compile threads, at least 8); all unseen
        neighbours of the best config are always in a step, even beyond this.
      top: neighbours of the best configs of this many regions are explored.
      patience: batches without improvement before stopping.
      explore: also try the configs the model predicts fastest anywhere in the space.
      min_gain: relative improvement that counts as one.
      seed: for the spread-out sample.
    """

    initial: int | None = None
    max_evals: int | None = None
    fraction: float = 0.3
    batch: int | None = None
    top: int = 3
    patience: int = 2
    explore: bool = True
    min_gain: float = 0.005
    seed: int = 0
    name: str = "coordinate"

    def search(self, ev: Evaluator) -> None:
        cands = list(ev.candidates)
        n = len(cands)
        points = [config_point(c) for c in cands]
        budget = self.max_evals if self.max_evals is not None else max(1, round(self.fraction * n))
        budget = min(n, max(budget, 1))
        rng = random.Random(self.seed)
        initial = self.initial if self.initial is not None else min(ev.workers, max(4, n // 10))
        batch = self.batch if self.batch is not None else max(8, ev.workers)
        first = spread_sample(
            points, max(1, min(initial, budget)), start=ev.reference_index, rng=rng
        )
        times: dict[int, float | None] = dict(ev.evaluate(first))
        while not _ranked(times) and len(times) < budget and not ev.exhausted():
            # Everything so far failed (e.g. blocks too large for this shape): look
            # elsewhere before giving up.
            rest = [i for i in range(n) if i not in times]
            more = spread_sample(
                [points[i] for i in rest], min(initial, budget - len(times)), rng=rng
            )
            times.update(ev.evaluate([rest[j] for j in more]))
        stall = 0
        while len(times) < budget and not ev.exhausted() and stall < self.patience:
            ranked = _ranked(times)
            if not ranked:
                break
            best_time = times[ranked[0]]
            by_model = _Model(points, times).rank
            # 1. Every unseen neighbour of the best config (a local optimum must be one).
            near = neighbours(points, ranked[0], 1)
            must = _unseen(near, times)
            # 2. A neighbour that failed (say, too much shared memory) may be one more
            #    change away from a good config.
            failed = [i for i in near if i in times and times[i] is None]
            groups = [
                by_model(
                    _unseen((j for i in failed for j in neighbours(points, i, 1)), times, must)
                )
            ]
            # 3. Neighbours of the best configs of other regions (two or more fields
            #    away from every better one): the best may sit in another basin.
            for seed in _diverse(points, ranked, self.top)[1:]:
                groups.append(by_model(_unseen(neighbours(points, seed, 1), times, must)))
            # 4. Two fields away from the best, once one field was not enough.
            if stall or not must:
                groups.append(by_model(_unseen(neighbours(points, ranked[0], 2), times, must)))
            # 5. Anything the model thinks fast, wherever it is.
            if self.explore:
                groups.append(by_model(_unseen(range(n), times, must)))
            room = budget - len(times)
            step = must[:room]
            for i in _round_robin(groups):
                if len(step) >= min(batch, room):
                    break
                if i not in step:
                    step.append(i)
            if not step:
                break
            times.update(ev.evaluate(step))
            new_best = _best(times)
            improved = new_best is not None and times[new_best] < best_time * (1 - self.min_gain)  # type: ignore[operator]
            stall = 0 if improved else stall + 1


def _diverse(
    points: Sequence[tuple[tuple[str, Any], ...]], ranked: Sequence[int], k: int
) -> list[int]:
    """The best of `ranked`, then each next one at least two fields away from every one
    already picked, up to `k`."""
    picked: list[int] = []
    for i in ranked:
        if all(_distance(points[i], points[j]) >= 2 for j in picked):
            picked.append(i)
            if len(picked) == k:
                break
    return picked


def _round_robin(groups: Sequence[Sequence[int]]) -> Iterable[int]:
    """The first of each group, then the second of each, and so on."""
    for row in itertools.zip_longest(*groups):
        yield from (i for i in row if i is not None)


def _unseen(
    indices: Iterable[int], times: Mapping[int, Any], also: Sequence[int] = ()
) -> list[int]:
    skip = set(also)
    return [i for i in dict.fromkeys(indices) if i not in times and i not in skip]


class _Model:
    """log(time) ≈ mean + an effect per field value + an effect per pair of field
    values, fitted by ridge least squares to the configs evaluated so far.

    The pair terms carry interactions such as "a wide tile is slow with 4 warps and
    fast with 8"; they are penalised more than the single-value terms, so with little
    data the model stays close to additive.
    """

    def __init__(
        self,
        points: Sequence[tuple[tuple[str, Any], ...]],
        times: Mapping[int, float | None],
        *,
        ridge: float = 0.5,
        pair_ridge: float = 2.0,
    ) -> None:
        self._points = points
        self._index: dict[tuple[Any, ...], int] = {}
        penalties: list[float] = []
        for p in points:
            for key in self._keys(p):
                if key not in self._index:
                    self._index[key] = len(self._index)
                    penalties.append(ridge if len(key) == 2 else pair_ridge)
        # Failures are left out: they come from combinations of values (a large tile
        # with deep pipelining) more than from any one value.
        ok = {i: t for i, t in times.items() if t is not None and t > 0}
        self._weights: np.ndarray | None = None
        if not ok:
            return
        x = np.array([self._features(points[i]) for i in ok])
        y = np.log(np.array(list(ok.values())))
        self._mean = float(y.mean())
        gram = x.T @ x + np.diag(penalties)
        self._weights = np.linalg.solve(gram, x.T @ (y - self._mean))

    @staticmethod
    def _keys(p: tuple[tuple[str, Any], ...]) -> list[tuple[Any, ...]]:
        singles = [(f, v) for f, (_, v) in enumerate(p)]
        pairs = [a + b for a, b in itertools.combinations(singles, 2)]
        return singles + pairs

    def _features(self, p: tuple[tuple[str, Any], ...]) -> np.ndarray:
        row = np.zeros(len(self._index))
        for key in self._keys(p):
            row[self._index[key]] = 1.0
        return row

    def predict_point(self, p: tuple[tuple[str, Any], ...]) -> float:
        if self._weights is None:
            return 0.0
        return float(self._features(p) @ self._weights + self._mean)

    def rank(self, indices: Iterable[int]) -> list[int]:
        """`indices` (into the points the model was built with), fastest predicted
        first."""
        return sorted(indices, key=lambda i: self.predict_point(self._points[i]))


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
