"""The geometry of a config space: a config as a point (its fields), distances and
neighbours between points, a spread-out sample, and a log-linear cost model fitted to
measured points (which configs are likely fast, or slow to compile)."""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np


class LogLinearModel:
    """log(time) ≈ mean + an effect per field value + an effect per pair of field
    values, fitted by ridge least squares to the configs evaluated so far.

    The pair terms carry interactions such as "a wide tile is slow with 4 warps and
    fast with 8"; they are penalised more than the single-value terms, so with little
    data the model stays close to additive. `pairs=False` leaves them out.
    """

    def __init__(
        self,
        points: Sequence[tuple[tuple[str, Any], ...]],
        times: Mapping[int, float | None],
        *,
        ridge: float = 0.5,
        pair_ridge: float = 2.0,
        pairs: bool = True,
    ) -> None:
        # A search refits the model after every step over the same points: their
        # features are built once (`_design`).
        self._features, penalties = _design(tuple(points), pairs, ridge, pair_ridge)
        # Failures are left out: they come from combinations of values (a large tile
        # with deep pipelining) more than from any one value.
        ok = {i: t for i, t in times.items() if t is not None and t > 0}
        self._weights: np.ndarray | None = None
        if not ok:
            return
        x = self._features[list(ok)]
        y = np.log(np.array(list(ok.values())))
        self._mean = float(y.mean())
        gram = x.T @ x + np.diag(penalties)
        self._weights = np.linalg.solve(gram, x.T @ (y - self._mean))

    def predict(self, i: int) -> float:
        """The predicted log time of point `i` (0 before any point was measured)."""
        if self._weights is None:
            return 0.0
        return float(self._features[i] @ self._weights + self._mean)

    def rank(self, indices: Iterable[int]) -> list[int]:
        """`indices` (into the points the model was built with), fastest predicted
        first."""
        return sorted(indices, key=self.predict)


#: The last designs built, by their arguments: a search refits over one point set, and
#: the compile-cost model over another. Kept only while small (a float64 matrix of
#: points x columns); a larger one is built for each fit, as it is needed.
_DESIGNS: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}
_DESIGNS_KEPT, _DESIGN_CELLS_KEPT = 2, 1 << 21
_designs_lock = threading.Lock()  # the tuner's threads fit models too


def _design(
    points: tuple[tuple[tuple[str, Any], ...], ...], pairs: bool, ridge: float, pair_ridge: float
) -> tuple[np.ndarray, np.ndarray]:
    """Every point's features (one column per field value, and per pair of values when
    `pairs`: 1 where the point has it) and each column's ridge penalty."""
    key = (points, pairs, ridge, pair_ridge)
    with _designs_lock:
        kept = _DESIGNS.get(key)
    if kept is not None:
        return kept
    index: dict[tuple[Any, ...], int] = {}
    penalties: list[float] = []
    rows = []
    for p in points:
        singles = [(f, v) for f, (_, v) in enumerate(p)]
        keys = singles + ([a + b for a, b in itertools.combinations(singles, 2)] if pairs else [])
        for k in keys:
            if k not in index:
                index[k] = len(index)
                penalties.append(ridge if len(k) == 2 else pair_ridge)
        rows.append([index[k] for k in keys])
    features = np.zeros((len(points), len(index)))
    for i, columns in enumerate(rows):
        features[i, columns] = 1.0
    design = (features, np.array(penalties))
    if features.size <= _DESIGN_CELLS_KEPT:
        with _designs_lock:
            while len(_DESIGNS) >= _DESIGNS_KEPT:
                _DESIGNS.pop(next(iter(_DESIGNS)))
            _DESIGNS[key] = design
    return design


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


def distance(a: tuple[tuple[str, Any], ...], b: tuple[tuple[str, Any], ...]) -> int:
    if len(a) != len(b):
        return max(len(a), len(b))
    return sum(1 for x, y in zip(a, b) if x != y)


def neighbours(points: Sequence[tuple[tuple[str, Any], ...]], at: int, radius: int) -> list[int]:
    """Indices of the candidates that differ from `points[at]` in exactly `radius`
    fields."""
    return [i for i, p in enumerate(points) if distance(p, points[at]) == radius]


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
    nearest = [distance(p, points[chosen[0]]) for p in points]
    while len(chosen) < k:
        far = max(nearest)
        options = [i for i in range(n) if nearest[i] == far and i not in chosen]
        pick = rng.choice(options)
        chosen.append(pick)
        nearest = [min(d, distance(p, points[pick])) for d, p in zip(nearest, points)]
    return chosen
