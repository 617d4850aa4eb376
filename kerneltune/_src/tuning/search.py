"""Search strategies: which candidates to compile and time, in what order.

A strategy drives an `Evaluator` (the tuner's bench): it asks for candidates to be
evaluated and reads back their median times. It never picks the winner itself: after
the search the tuner re-measures the best few side by side and decides.

- `Exhaustive`: every candidate. The default for small spaces.
- `CoordinateDescent`: starts from the heuristic config and a spread-out sample, then
  repeatedly evaluates the config_space.neighbours of the best configs found so far (configs that
  differ in one field, then in two) until none is faster or the budget is spent.
  Compiles a fraction of the space, which is what costs most on a GPU. With an
  `AsyncEvaluator` (the tuner's bench is one) it is pipelined: each result that lands
  makes room for the next proposal, so no compile thread waits for a batch's slowest
  compile. The geometry it walks (points, neighbours, a cost model) is `config_space.py`.
- `SuccessiveHalving`: compiles everything, times each candidate briefly, and spends
  more samples only on the fastest third, then the fastest third of those. For spaces
  where timing (slow kernels), not compiling, is the cost.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from kerneltune._src.tuning import config_space


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
class AsyncEvaluator(Evaluator, Protocol):
    """An evaluator that also takes candidates without waiting for them, so a search
    can keep every compile thread busy and propose the next candidates as soon as any
    result lands, instead of waiting for a whole batch (as slow as its slowest
    compile)."""

    @property
    def pending(self) -> int:
        """Candidates submitted whose result `wait` has not returned yet."""
        ...

    def submit(self, indices: Sequence[int], rounds: int | None = None) -> list[int]:
        """Starts evaluating the candidates at `indices` and returns those accepted
        (candidates beyond the budget are not)."""
        ...

    def wait(self) -> dict[int, float | None]:
        """Blocks until at least one submitted candidate is done; returns the median
        seconds of every one done since the last call (None when it failed), or an
        empty dict when nothing is pending."""
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

    Configs are dataclasses or mappings; a candidate's config_space.neighbours are the candidates
    that differ from it in one field (radius 1) or two (radius 2). It starts from the
    heuristic config plus `initial` candidates spread across the space, then evaluates
    the unseen config_space.neighbours of the best config found so far, widening to radius 2 around it
    when the results bring no improvement; config_space.neighbours of the best configs of other
    regions and the configs a small model (log-time ≈ effects of field values and of
    pairs of values, fitted to every result so far) predicts fastest come next, most
    promising first. It stops after `patience` batches' worth of results without
    improvement, or when the budget is spent.

    Pipelined (the default, with an evaluator that has `submit` and `wait`): up to
    `batch` candidates are in flight, and each result that lands frees a place for the
    next proposal, made with every result so far; no compile thread waits for the
    slowest compile of a batch. Otherwise it evaluates batches, one after the other.

    Args:
      initial: how many spread-out candidates to start from (default: at most a tenth of
        the space, at least 4, at most `batch`).
      max_evals: stop after this many candidates (default: `fraction` of the space).
      fraction: the default budget as a fraction of the space.
      batch: candidates in flight (pipelined) or per step (default: the compile
        threads, at least 8); a batched step always holds every unseen neighbour of the
        best config, even beyond this.
      top: config_space.neighbours of the best configs of this many regions are explored.
      patience: batches' worth of results without improvement before stopping.
      explore: also try the configs the model predicts fastest anywhere in the space.
      min_gain: relative improvement that counts as one.
      seed: for the spread-out sample.
      pipelined: propose candidates as results land (when the evaluator can).
      quorum: pipelined, a proposal waits until this fraction of the candidates
        submitted so far have landed: the first results are the quickest compiles (small
        tiles), rarely the best, and proposals made from them alone waste the budget.
    """

    initial: int | None = None
    max_evals: int | None = None
    fraction: float = 0.4
    batch: int | None = None
    top: int = 3
    patience: int = 2
    explore: bool = True
    min_gain: float = 0.005
    seed: int = 0
    pipelined: bool = True
    quorum: float = 0.6
    name: str = "coordinate"

    def search(self, ev: Evaluator) -> None:
        if self.pipelined and isinstance(ev, AsyncEvaluator):
            self._search_pipelined(ev)
        else:
            self._search_batched(ev)

    def _setup(self, ev: Evaluator) -> tuple[list[Any], int, int, int, random.Random]:
        points = [config_space.config_point(c) for c in ev.candidates]
        n = len(points)
        budget = self.max_evals if self.max_evals is not None else max(1, round(self.fraction * n))
        budget = min(n, max(budget, 1))
        batch = self.batch if self.batch is not None else max(8, ev.workers)
        initial = self.initial if self.initial is not None else min(batch, max(4, n // 10))
        return points, budget, batch, max(1, min(initial, budget)), random.Random(self.seed)

    def _search_batched(self, ev: Evaluator) -> None:
        points, budget, batch, initial, rng = self._setup(ev)
        n = len(points)
        first = config_space.spread_sample(points, initial, start=ev.reference_index, rng=rng)
        times: dict[int, float | None] = dict(ev.evaluate(first))
        while not _ranked(times) and len(times) < budget and not ev.exhausted():
            # Everything so far failed (e.g. blocks too large for this shape): look
            # elsewhere before giving up.
            rest = [i for i in range(n) if i not in times]
            more = config_space.spread_sample(
                [points[i] for i in rest], min(initial, budget - len(times)), rng=rng
            )
            times.update(ev.evaluate([rest[j] for j in more]))
        stall = 0
        while len(times) < budget and not ev.exhausted() and stall < self.patience:
            if not _ranked(times):
                break
            best_time = times[_ranked(times)[0]]
            must, others = self._proposals(points, times, times, widen=stall > 0)
            room = budget - len(times)
            step = must[:room]
            for i in others:
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

    def _search_pipelined(self, ev: AsyncEvaluator) -> None:
        points, budget, depth, initial, rng = self._setup(ev)
        n = len(points)
        taken: set[int] = set()  # submitted: done or in flight
        times: dict[int, float | None] = {}

        def send(indices: Iterable[int]) -> None:
            fresh = [i for i in dict.fromkeys(indices) if i not in taken]
            if fresh:
                taken.update(ev.submit(fresh[: budget - len(taken)]))

        send(config_space.spread_sample(points, initial, start=ev.reference_index, rng=rng))
        best, since_gain = math.inf, 0
        while ev.pending:
            for i, t in ev.wait().items():
                times[i] = t
                if t is not None and t < best * (1 - self.min_gain):
                    best, since_gain = t, 0
                else:
                    since_gain += 1
            free = min(depth - ev.pending, budget - len(taken))
            if free <= 0 or ev.exhausted() or since_gain >= self.patience * depth:
                continue  # the ones in flight still land
            if len(times) < self.quorum * len(taken):
                continue  # too little known yet for a good proposal
            if not _ranked(times):
                if ev.pending:
                    continue  # the first results are still coming
                # Everything so far failed: look elsewhere before giving up.
                rest = [i for i in range(n) if i not in taken]
                more = config_space.spread_sample(
                    [points[i] for i in rest], min(initial, free), rng=rng
                )
                send(rest[j] for j in more)
                continue
            must, others = self._proposals(points, times, taken, widen=since_gain >= depth)
            step: list[int] = []
            for i in itertools.chain(must, others):
                if len(step) >= free:
                    break
                if i not in step:
                    step.append(i)
            send(step)

    def _proposals(
        self,
        points: Sequence[tuple[tuple[str, Any], ...]],
        times: Mapping[int, float | None],
        taken: Container[int],
        *,
        widen: bool,
    ) -> tuple[list[int], Iterable[int]]:
        """What to evaluate next, given the results so far (`taken`: candidates already
        evaluated or under way): the unseen config_space.neighbours of the best config (all of them
        belong in a batched step), then the other groups, interleaved, each most
        promising first by the model."""
        ranked = _ranked(times)
        by_model = config_space.LogLinearModel(points, times).rank
        # 1. Every unseen neighbour of the best config (a local optimum must be one).
        near = config_space.neighbours(points, ranked[0], 1)
        must = by_model(_unseen(near, taken))
        # 2. Neighbours of the next best few: the way out of a local optimum is often
        #    through a slightly slower config (a wider tile needs more warps, say).
        groups = [
            by_model(_unseen(config_space.neighbours(points, i, 1), taken, must))
            for i in ranked[1 : self.top]
        ]
        # 3. A neighbour that failed (say, too much shared memory) may be one more
        #    change away from a good config.
        failed = [i for i in near if i in times and times[i] is None]
        groups.append(
            by_model(
                _unseen(
                    (j for i in failed for j in config_space.neighbours(points, i, 1)), taken, must
                )
            )
        )
        # 4. Neighbours of the best configs of other regions (two or more fields away
        #    from every better one): the best may sit in another basin.
        for seed in _diverse(points, ranked, self.top)[1:]:
            groups.append(by_model(_unseen(config_space.neighbours(points, seed, 1), taken, must)))
        # 5. Two fields away from the best, once one field was not enough.
        if widen or not must:
            groups.append(
                by_model(_unseen(config_space.neighbours(points, ranked[0], 2), taken, must))
            )
        # 6. Anything the model thinks fast, wherever it is.
        if self.explore:
            groups.append(by_model(_unseen(range(len(points)), taken, must)))
        return must, _round_robin(groups)


def _diverse(
    points: Sequence[tuple[tuple[str, Any], ...]], ranked: Sequence[int], k: int
) -> list[int]:
    """The best of `ranked`, then each next one at least two fields away from every one
    already picked, up to `k`."""
    picked: list[int] = []
    for i in ranked:
        if all(config_space.distance(points[i], points[j]) >= 2 for j in picked):
            picked.append(i)
            if len(picked) == k:
                break
    return picked


def _round_robin(groups: Sequence[Sequence[int]]) -> Iterable[int]:
    """The first of each group, then the second of each, and so on."""
    for row in itertools.zip_longest(*groups):
        yield from (i for i in row if i is not None)


def _unseen(indices: Iterable[int], taken: Container[int], also: Sequence[int] = ()) -> list[int]:
    skip = set(also)
    return [i for i in dict.fromkeys(indices) if i not in taken and i not in skip]


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
