"""Search strategies on a synthetic matmul-like space, and through the real Tuner."""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
import random
import threading
import time

import jax.numpy as jnp
import pytest

from kerneltune._src.tuning import config_space, search, timing
from kerneltune._src.tuning.bench import Bench
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.settings import BenchSettings
from kerneltune._src.tuning.tuner import Tuner


@dataclasses.dataclass(frozen=True, kw_only=True)
class MM:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int


SPACE = [
    MM(bm=bm, bn=bn, bk=bk, warps=w, stages=s)
    for bm, bn, bk, w, s in itertools.product(
        (64, 128, 256), (64, 128, 256), (32, 64), (4, 8), (2, 3, 4)
    )
]
HEURISTIC = MM(bm=128, bn=128, bk=32, warps=4, stages=2)


def synthetic_cost(cfg: MM, m=4096, n=4096, k=2048, roughness_seed=0) -> float | None:
    """A matmul-like cost: waves of tiles over 132 units, tile efficiency growing with
    tile area, warps that must match the tile, pipelining that helps until shared
    memory runs out (then the config fails), and a few percent of per-config
    roughness so the landscape is not perfectly smooth."""
    smem = cfg.stages * (cfg.bm + cfg.bn) * cfg.bk * 2
    if smem > 160 * 1024:
        return None
    tiles = math.ceil(m / cfg.bm) * math.ceil(n / cfg.bn)
    waves = math.ceil(tiles / 132)
    area = cfg.bm * cfg.bn
    eff = min(1.0, area / (128 * 256)) ** 0.6
    eff *= 1.0 if (cfg.warps == 8) == (area >= 128 * 256) else 0.75
    eff *= {2: 0.8, 3: 0.95, 4: 1.0}[cfg.stages] * (1.0 if cfg.bk == 64 else 0.93)
    jitter = random.Random(hash((roughness_seed, dataclasses.astuple(cfg)))).uniform(0.97, 1.03)
    return waves * area * k / eff * jitter * 1e-12


class FakeEvaluator:
    """The Evaluator protocol over a cost function, counting evaluations."""

    def __init__(self, cands, cost, reference=None, workers=8, max_evals=None):
        self._cands = list(cands)
        self._cost = cost
        self.reference_index = self._cands.index(reference) if reference in self._cands else None
        self.workers = workers
        self.max_evals = max_evals
        self.seen: dict[int, float | None] = {}
        self.batches: list[list[int]] = []

    @property
    def candidates(self):
        return self._cands

    def evaluate(self, indices, rounds=None):
        new = [i for i in dict.fromkeys(indices) if i not in self.seen]
        if self.max_evals is not None:
            new = new[: max(0, self.max_evals - len(self.seen))]
        if new:
            self.batches.append(new)
        for i in new:
            self.seen[i] = self._cost(self._cands[i])
        return {i: self.seen[i] for i in indices if i in self.seen}

    def exhausted(self):
        return self.max_evals is not None and len(self.seen) >= self.max_evals


def exhaustive_best(cost):
    return min(c for c in (cost(c) for c in SPACE) if c is not None)


def compile_latency(cfg: MM, seed: int = 0) -> float:
    """A made-up compile time: larger tiles and deeper pipelines take longer (up to
    about 7x the smallest), with some per-config spread."""
    spread = random.Random(hash((seed, dataclasses.astuple(cfg)))).uniform(0.8, 1.25)
    return (0.12 + 0.5 * (cfg.bm * cfg.bn * cfg.bk) / (256 * 256 * 64) * cfg.stages / 3) * spread


class SimulatedEvaluator(FakeEvaluator):
    """The AsyncEvaluator protocol with simulated time: one lowering lane (`lower_s`
    per candidate) feeding `workers` compile slots, each candidate taking
    `latency(cfg)`. `evaluate` waits for all it started (a batch barrier); `wait`
    advances the clock to the next candidate that lands."""

    def __init__(self, cands, cost, latency, lower_s=0.016, **kw):
        super().__init__(cands, cost, **kw)
        self._latency = latency
        self._lower_s = lower_s
        self.clock = 0.0
        self._lane_free = 0.0
        self._slots = [0.0] * self.workers
        self._events: list[tuple[float, int]] = []

    @property
    def pending(self):
        return len(self._events)

    def submit(self, indices, rounds=None):
        accepted = []
        for i in dict.fromkeys(indices):
            if i not in self.seen:
                if self.max_evals is not None and len(self.seen) >= self.max_evals:
                    break
                self.seen[i] = None
                self._lane_free = max(self.clock, self._lane_free) + self._lower_s
                slot = min(range(self.workers), key=self._slots.__getitem__)
                end = max(self._lane_free, self._slots[slot]) + self._latency(self._cands[i])
                self._slots[slot] = end
                heapq.heappush(self._events, (end, i))
            accepted.append(i)
        return accepted

    def _land(self):
        end, i = heapq.heappop(self._events)
        self.clock = max(self.clock, end)
        self.seen[i] = self._cost(self._cands[i])
        return i

    def wait(self):
        if not self._events:
            return {}
        landed = [self._land()]
        while self._events and self._events[0][0] <= self.clock:
            landed.append(self._land())
        return {i: self.seen[i] for i in landed}

    def evaluate(self, indices, rounds=None):
        accepted = set(self.submit(indices))
        self.batches.append(sorted(accepted))
        while any(i in accepted for _, i in self._events):
            self._land()
        return {i: self.seen[i] for i in accepted}


SHAPES = [(4096, 4096, 2048), (8192, 1024, 4096), (1024, 1024, 8192)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("pipelined", [True, False])
def test_coordinate_descent_reaches_near_best_with_a_fraction(shape, pipelined):
    m, n, k = shape
    regrets = []
    for seed in range(10):

        def cost(c, seed=seed):
            return synthetic_cost(c, m, n, k, roughness_seed=seed)

        evaluator = SimulatedEvaluator if pipelined else FakeEvaluator
        kw = {"latency": compile_latency} if pipelined else {}
        ev = evaluator(SPACE, cost, reference=HEURISTIC, workers=16, **kw)
        strategy = search.CoordinateDescent(seed=seed)
        assert isinstance(ev, search.AsyncEvaluator) == pipelined
        strategy.search(ev)
        found = min(t for t in ev.seen.values() if t is not None)
        regrets.append(found / exhaustive_best(cost) - 1)
        assert len(ev.seen) <= strategy.fraction * len(SPACE) + 1
    # The roughness is ±3% per config, so "near" means within that band.
    assert max(regrets) <= 0.06
    assert sum(regrets) / len(regrets) <= 0.015


def test_pipelined_search_beats_batches_on_simulated_compile_times():
    """The same budget, as good a winner, and clearly less (simulated) wall time than
    batches that each wait for their slowest compile."""
    walls: dict[bool, float] = {True: 0.0, False: 0.0}
    regrets: dict[bool, list[float]] = {True: [], False: []}
    for (m, n, k), seed in itertools.product(SHAPES, range(6)):

        def cost(c, seed=seed, m=m, n=n, k=k):
            return synthetic_cost(c, m, n, k, roughness_seed=seed)

        for pipelined in (True, False):
            ev = SimulatedEvaluator(
                SPACE,
                cost,
                functools.partial(compile_latency, seed=seed),
                reference=HEURISTIC,
                workers=16,
            )
            search.CoordinateDescent(seed=seed, pipelined=pipelined).search(ev)
            assert ev.pending == 0
            walls[pipelined] += ev.clock
            found = min(t for t in ev.seen.values() if t is not None)
            regrets[pipelined].append(found / exhaustive_best(cost) - 1)
    assert walls[True] <= 0.75 * walls[False]
    for pipelined in (True, False):
        assert max(regrets[pipelined]) <= 0.06
        assert sum(regrets[pipelined]) / len(regrets[pipelined]) <= 0.015


def test_successive_halving_finds_the_best_and_times_few_for_long():
    rounds_asked: dict[int, int] = {}

    class Counting(FakeEvaluator):
        def evaluate(self, indices, rounds=None):
            for i in indices:
                rounds_asked[i] = rounds_asked.get(i, 0) + (rounds or 3)
            return super().evaluate(indices, rounds)

    ev = Counting(SPACE, synthetic_cost)
    search.SuccessiveHalving().search(ev)
    best = min((i for i, t in ev.seen.items() if t is not None), key=lambda i: ev.seen[i])
    assert ev.seen[best] == exhaustive_best(synthetic_cost)
    heavy = [i for i, r in rounds_asked.items() if r > 1]
    assert len(heavy) <= len(SPACE) // 3 + 1


def test_exhaustive_evaluates_everything():
    ev = FakeEvaluator(SPACE, synthetic_cost)
    search.Exhaustive().search(ev)
    assert len(ev.seen) == len(SPACE)


def test_coordinate_descent_respects_the_evaluation_budget():
    ev = FakeEvaluator(SPACE, synthetic_cost, reference=HEURISTIC, max_evals=10)
    search.CoordinateDescent(max_evals=50).search(ev)
    assert len(ev.seen) == 10
    ev = FakeEvaluator(SPACE, synthetic_cost, reference=HEURISTIC)
    search.CoordinateDescent(max_evals=12).search(ev)
    assert len(ev.seen) <= 12


def test_coordinate_descent_keeps_looking_when_the_start_fails():
    def cost(c):
        return None if c.bm != 64 else synthetic_cost(c)

    ev = FakeEvaluator(
        SPACE, cost, reference=MM(bm=256, bn=256, bk=64, warps=8, stages=4), workers=4
    )
    search.CoordinateDescent(initial=4).search(ev)
    assert any(t is not None for t in ev.seen.values())


def test_spread_sample_and_neighbours():
    points = [config_space.config_point(c) for c in SPACE]
    start = SPACE.index(HEURISTIC)
    picked = config_space.spread_sample(points, 6, start=start, rng=random.Random(0))
    assert picked[0] == start and len(set(picked)) == 6
    near = config_space.neighbours(points, start, 1)
    assert len(near) == 2 + 2 + 1 + 1 + 2
    assert all(sum(a != b for a, b in zip(points[i], points[start])) == 1 for i in near)
    assert config_space.config_point({"b": 1, "a": 2}) == (("a", 2), ("b", 1))
    assert config_space.config_point(7) == (("cfg", 7),)


def test_resolve_strategy():
    assert search.resolve_strategy("auto", 10, None).name == "exhaustive"
    assert search.resolve_strategy("auto", 500, None).name == "coordinate"
    assert search.resolve_strategy("auto", 10, 5).name == "coordinate"
    assert search.resolve_strategy("halving", 10, None).name == "halving"
    custom = search.Exhaustive()
    assert search.resolve_strategy(custom, 10, None) is custom
    with pytest.raises(ValueError, match="strategy"):
        search.resolve_strategy("bayes", 10, None)


class CostFromOutput:
    """A timer reporting the synthetic cost each candidate computes into its output, so
    the real Tuner can be driven over a synthetic landscape quickly."""

    name = "synthetic"

    def sample(self, fn, arg_sets, calls, start):
        return float(fn(*arg_sets[0])[0])


def synthetic_make_fn(cfg):
    cost = synthetic_cost(cfg)
    if cost is None:
        raise ValueError("shared memory exceeded")
    return lambda x: x * 0.0 + cost


@pytest.fixture(scope="module")
def exhaustive_search():
    """The exhaustive search of SPACE through the tuner: the same for every strategy
    compared with it, so run once (its 108 candidates are 108 compiles)."""
    x = jnp.ones((4,), jnp.float32)
    exhaustive = Tuner(
        timer=CostFromOutput(), strategy="exhaustive", validate=False, progress=False
    )
    return exhaustive.tune(synthetic_make_fn, (x,), {}, SPACE, reference_cfg=HEURISTIC)


@pytest.mark.parametrize("strategy", ["coordinate", "halving"])
def test_budgeted_search_through_the_tuner(strategy, exhaustive_search):
    x = jnp.ones((4,), jnp.float32)
    assert isinstance(CostFromOutput(), timing.Timer)
    full = exhaustive_search
    budgeted = Tuner(timer=CostFromOutput(), strategy=strategy, validate=False, progress=False)
    part = budgeted.tune(synthetic_make_fn, (x,), {}, SPACE, reference_cfg=HEURISTIC)
    assert part.strategy == strategy
    assert part.best_time_s <= full.best_time_s * 1.03
    if strategy == "coordinate":
        assert part.num_evaluated <= 0.4 * len(SPACE)
        assert sum(c.status == "pruned" for c in part.candidates) >= 0.6 * len(SPACE)
    assert full.num_evaluated == len(SPACE)
    failed = [c for c in full.candidates if c.status == "compile_error"]
    assert failed and all("shared memory" in c.error for c in failed)


def test_time_budget_stops_starting_candidates():
    x = jnp.ones((4,), jnp.float32)
    tuner = Tuner(
        timer=CostFromOutput(), strategy="exhaustive", validate=False, progress=False, max_evals=7
    )
    report = tuner.tune(synthetic_make_fn, (x,), {}, SPACE)
    assert report.num_evaluated == 7
    tiny = Tuner(timer=CostFromOutput(), validate=False, progress=False, time_budget_s=1e-9)
    report = tiny.tune(synthetic_make_fn, (x,), {}, SPACE[:5])
    assert report.best is None and report.num_evaluated == 0


class DeviceCostTimer(CostFromOutput):
    """`CostFromOutput` as a device timer would be: not disturbed by compiles running
    on the host, so the bench samples candidates while others still compile."""

    device_time = True


def test_pipelined_search_through_the_bench_with_compile_threads():
    """Real threads: compiles that sleep (releasing the GIL) as long as a made-up
    compile time. Through the real bench, both searches keep several compiles in flight
    at once and the pipelined one finds the best. How much sooner pipelining finishes is
    asserted in simulated time (above): on a loaded 2-core machine the wall clock of
    sleeping threads says more about the scheduler than about the search."""
    x = jnp.ones((4,), jnp.float32)
    lock = threading.Lock()
    in_flight = [0]
    most_in_flight: dict[bool, int] = {}

    def compile_(cfg):
        with lock:
            in_flight[0] += 1
            most_in_flight[pipelined] = max(most_in_flight.get(pipelined, 0), in_flight[0])
        try:
            time.sleep(0.25 * compile_latency(cfg))
        finally:
            with lock:
                in_flight[0] -= 1
        cost = synthetic_cost(cfg)
        if cost is None:
            raise ValueError("shared memory exceeded")
        out = jnp.full((4,), cost, jnp.float32)
        return lambda *args: out

    best = {}
    for pipelined in (False, True):
        settings = BenchSettings(
            warmup=1,
            rounds=1,
            target_sample_s=None,
            compile_timeout_s=None,
            max_workers=8,
            max_evals=None,
            deadline=None,
            rtol=None,
            validate=False,
            seed=0,
        )
        bench = Bench(
            lambda cfg: cfg,
            compile_,
            [[x]],
            SPACE,
            HEURISTIC,
            DeviceCostTimer(),
            settings,
            Progress("", False),
        )
        try:
            search.CoordinateDescent(pipelined=pipelined).search(bench)
            assert bench.pending == 0
        finally:
            bench.close()
        results = bench.results()
        assert sum(r.status != "pruned" for r in results) <= 0.4 * len(SPACE) + 1
        best[pipelined] = min(r.time_s for r in results if r.ok)
    assert min(most_in_flight.values()) >= 2, most_in_flight
    assert best[True] <= exhaustive_best(synthetic_cost) * 1.03


def test_the_cost_model_recovers_an_additive_cost_on_each_space_it_is_given():
    # The model's features are built once per point set (a search refits after every
    # step): two spaces in turn, and a space refitted with more data, each rank by
    # their own costs.
    import itertools
    import math

    from kerneltune._src.tuning.config_space import LogLinearModel

    def space(fields):
        return [tuple(zip(fields, values)) for values in itertools.product((1, 2, 4), repeat=3)]

    def cost(point, scale):
        return math.exp(sum(scale[k] * math.log2(v) for k, v in point))

    for fields, scale in [(("a", "b", "c"), {"a": 1.0, "b": -0.5, "c": 0.2}),
                          (("x", "y", "z"), {"x": -1.0, "y": 0.7, "z": 0.3})]:  # fmt: skip
        points = space(fields)
        for measured in (12, 27):
            times = {i: cost(points[i], scale) for i in range(0, 27, 27 // measured)}
            ranked = LogLinearModel(points, times).rank(range(27))
            truth = sorted(range(27), key=lambda i: cost(points[i], scale))
            assert ranked[0] == truth[0] and ranked[-1] == truth[-1], (fields, measured)
