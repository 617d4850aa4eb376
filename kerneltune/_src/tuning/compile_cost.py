"""Which candidates take longest to compile: they start first, so that no long
compile is the last one running."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kerneltune._src.tuning import config_space

#: Compile times observed before the compile-time model reorders the queue, and how
#: many more between updates.
COST_MODEL_EVERY = 8


class CompileCostModel:
    """Predicts which candidates take longest to compile, so they start first and no
    long compile is the last one running.

    Before any compile has finished, the guess is the sum of log2 of the config's
    positive numeric fields (larger tiles, more warps and deeper pipelines make more
    code to compile); then a log-linear model of the observed compile times
    (`config_space.LogLinearModel`), refitted every `COST_MODEL_EVERY` observations.
    """

    def __init__(self, cfgs: Sequence[Any]) -> None:
        self._points = [config_space.config_point(c) for c in cfgs]
        self._prior = [prior_size(p) for p in self._points]
        self._seen: dict[int, float] = {}
        self._model: config_space.LogLinearModel | None = None

    def predict(self, index: int) -> float:
        if self._model is None:
            return self._prior[index]
        return self._model.predict(index)

    def observe(self, index: int, seconds: float) -> bool:
        """Records a compile time; True when the model changed."""
        if seconds <= 0:
            return False
        self._seen[index] = seconds
        n = len(self._seen)
        if n < COST_MODEL_EVERY or n % COST_MODEL_EVERY:
            return False
        self._model = config_space.LogLinearModel(self._points, self._seen, pairs=False)
        return True


def prior_size(point: tuple[tuple[str, Any], ...]) -> float:
    total = 0.0
    for _, v in point:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            total += math.log2(v + 1)
    return total
