"""Warm start: tuned neighbours (same op, dtypes and static values; other sizes) seed the
search of a new call, from this process, the persistent cache or the shipped tables."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune._src.caching import shipped, storage, tuned_neighbours
from kerneltune._src.caching.cache_entry import entry_from_document
from kerneltune._src.core import call_shapes
from kerneltune._src.kernel.base import make_invocation
from kerneltune._src.tuning import search, warm_start
from tests.helpers import cost_tuner, rand

# --- call shapes ------------------------------------------------------------------------


def shape_of(kernel, *args, **kwargs):
    return make_invocation(kernel, args, kwargs).shape


def test_calls_that_differ_only_in_sizes_share_a_family():
    k = GridKernel()
    a = shape_of(k, jnp.ones((64, 8)))
    b = shape_of(k, jnp.ones((256, 8)))
    assert a.family == b.family
    assert (a.sizes, b.sizes) == ((64, 8), (256, 8))
    assert call_shapes.distance(a.sizes, b.sizes) == 2.0


@pytest.mark.parametrize(
    "other",
    [
        lambda k: shape_of(k, jnp.ones((64, 8), jnp.bfloat16)),  # dtype
        lambda k: shape_of(k, jnp.ones((64, 8, 1))),  # rank
        lambda k: shape_of(k, jnp.ones((64, 8)), scale=2),  # static value
    ],
)
def test_a_family_holds_dtypes_ranks_and_static_values(other):
    k = GridKernel()
    assert other(k).family != shape_of(k, jnp.ones((64, 8))).family


def test_nearest_orders_by_distance_within_the_family():
    s = call_shapes.CallShape("f", (128,))
    tuned = [
        (call_shapes.CallShape("f", (1024,)), "far"),
        (call_shapes.CallShape("f", (256,)), "near"),
        (call_shapes.CallShape("g", (128,)), "other family"),
        (call_shapes.CallShape("f", (64,)), "near too"),
        (call_shapes.CallShape("f", (512,)), "mid"),
    ]
    found = call_shapes.nearest(s, tuned)
    assert [v for _, v in found] == ["near", "near too", "mid", "far"]
    assert [d for d, _ in found] == [1.0, 1.0, 2.0, 3.0]
    assert [v for _, v in call_shapes.nearest(s, tuned, limit=2)] == ["near", "near too"]


def test_ranked_keeps_the_winner_then_the_best_of_other_regions():
    times = [
        (Tile(128, 128, 64, 8, 3), 1.0),
        (Tile(128, 128, 64, 8, 4), 1.01),  # one field from the winner: same region
        (Tile(64, 256, 64, 8, 3), 1.1),  # two fields away: another region
        (Tile(64, 64, 32, 4, 2), None),  # failed
        (Tile(256, 64, 32, 4, 2), 1.5),
    ]
    assert tuned_neighbours.ranked(times) == (
        Tile(128, 128, 64, 8, 3),
        Tile(64, 256, 64, 8, 3),
        Tile(256, 64, 32, 4, 2),
    )
    # The config the call uses (after agreement, say) comes first.
    assert tuned_neighbours.ranked(times, Tile(256, 64, 32, 4, 2))[0] == Tile(256, 64, 32, 4, 2)


def test_ranked_tries_a_losing_backend_once():
    # Two Mosaic runner-ups of an XLA winner each cost an H100 0.6-0.9 s of lowering
    # and compiling at every new size (and neither won): the best of each other backend
    # is kept, then other regions of the winner's backend.
    def cfg(backend, bm, bn):
        return {"backend": backend, "bm": bm, "bn": bn, "bk": 64}

    times = [
        (cfg("xla", 128, 128), 1.0),
        (cfg("mosaic", 128, 256), 1.05),
        (cfg("mosaic", 256, 128), 1.06),  # two fields from the first Mosaic one
        (cfg("triton", 64, 64), 1.2),
    ]
    assert tuned_neighbours.ranked(times) == (
        cfg("xla", 128, 128),
        cfg("mosaic", 128, 256),
        cfg("triton", 64, 64),
    )
    # However far behind: on the H100 table attention's Pallas kernel, 27% behind
    # cuDNN at B8 T2048, wins by 9% at B16 T1024 (dropping runner-ups more than 10%
    # behind raised attention's p90 warm-start regret in the replay from 0% to 8.8%).
    times[3] = (cfg("triton", 64, 64), 1.27)
    assert cfg("triton", 64, 64) in tuned_neighbours.ranked(times)
    # Twice as slow or more is no hint: a Pallas norm's forward + backward 4.7x behind
    # XLA's cost an H200 about 1 s at every new size of a training step.
    times[3] = (cfg("triton", 64, 64), 2.01)
    assert cfg("triton", 64, 64) not in tuned_neighbours.ranked(times)
    assert cfg("triton", 64, 64) not in tuned_neighbours.ranked(times, cfg("mosaic", 128, 256))
    # Regions of the winner's own backend still count as before.
    times = [
        (cfg("triton", 128, 128), 1.0),
        (cfg("triton", 64, 256), 1.1),
        (cfg("mosaic", 64, 64), 1.2),
    ]
    assert len(tuned_neighbours.ranked(times)) == 3


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"family": 3, "sizes": []},
        {"family": "f", "sizes": [1, -2]},
        {"family": "f", "sizes": [True]},
    ],
)
def test_a_malformed_stored_shape_is_none(data):
    assert call_shapes.CallShape.from_json(data) is None


# --- the strategy, on a synthetic landscape ------------------------------------------------

FIELDS = {"bm": (64, 128, 256), "bn": (64, 128, 256), "bk": (32, 64), "w": (4, 8), "s": (2, 3, 4)}


@dataclasses.dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    bk: int
    w: int
    s: int


SPACE = [Tile(*v) for v in itertools.product(*FIELDS.values())]  # 108 candidates


def landscape(best: Tile):
    """Time grows with each field's distance (in steps) from `best`."""

    def time_of(c: Tile) -> float:
        steps = sum(
            abs(FIELDS[f].index(getattr(c, f)) - FIELDS[f].index(getattr(best, f))) for f in FIELDS
        )
        return 1.0 + 0.1 * steps

    return time_of


class FakeEvaluator:
    def __init__(self, time_of, reference=0, fails=()):
        self.candidates = SPACE
        self.reference_index = reference
        self.workers = 8
        self.time_of, self.fails, self.seen = time_of, set(fails), {}

    def evaluate(self, indices, rounds=None):
        for i in indices:
            self.seen[i] = None if i in self.fails else self.time_of(SPACE[i])
        return {i: self.seen[i] for i in indices}

    def exhausted(self):
        return False


def test_warm_start_climbs_from_a_nearby_winner_to_the_best_within_a_quarter_of_the_space():
    best = Tile(256, 128, 64, 8, 3)
    hint = SPACE.index(Tile(128, 128, 64, 8, 3))  # one field off, as a neighbour's winner is
    ev = FakeEvaluator(landscape(best))
    warm_start.WarmStart((hint,)).search(ev)
    assert SPACE.index(best) in ev.seen
    assert len(ev.seen) <= 0.25 * len(SPACE)
    assert 0 in ev.seen  # the heuristic is always a contender


def test_warm_start_stops_at_a_hint_that_is_already_the_best():
    best = Tile(64, 256, 32, 4, 2)
    ev = FakeEvaluator(landscape(best), reference=len(SPACE) - 1)  # far from the hint
    warm_start.WarmStart((SPACE.index(best),)).search(ev)
    # The heuristic, the hint and its one-field neighbours (2+2+1+1+2): one batch.
    assert len(ev.seen) == 1 + 1 + 8


def test_warm_start_searches_elsewhere_when_everything_near_the_hints_fails():
    hint = SPACE.index(Tile(256, 256, 64, 8, 4))
    near = {
        hint,
        0,
        *(
            i
            for i, c in enumerate(SPACE)
            if sum(a != b for a, b in zip(dataclasses.astuple(c), dataclasses.astuple(SPACE[hint])))
            == 1
        ),
    }
    ev = FakeEvaluator(landscape(Tile(64, 64, 32, 4, 2)), fails=near)
    warm_start.WarmStart((hint,), max_evals=60).search(ev)
    assert len(ev.seen) > len(near)
    assert any(t is not None for t in ev.seen.values())


def test_the_auto_strategy_warm_starts_only_with_a_usable_hint_and_a_large_space():
    s = warm_start.strategy_for("auto", SPACE, [Tile(64, 64, 32, 4, 2)], None)
    assert isinstance(s, warm_start.WarmStart) and s.hints == (0,)
    assert isinstance(
        warm_start.strategy_for("auto", SPACE, [Tile(1, 1, 1, 1, 1)], None), search.Exhaustive
    )
    assert isinstance(
        warm_start.strategy_for("auto", SPACE[:8], [SPACE[0]], None), search.Exhaustive
    )
    assert isinstance(
        warm_start.strategy_for("exhaustive", SPACE, [SPACE[0]], None), search.Exhaustive
    )


# --- through the selection chain ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GridCfg:
    a: int
    b: int


def grid_cost(cfg: GridCfg, n: int) -> int:
    """The best `a` grows with the call's size (log2 n - 3); the best `b` is 3."""
    return 1 + 10 * abs(cfg.a - (int(math.log2(n)) - 3)) + 10 * abs(cfg.b - 3)


class GridKernel(kt.Kernel):
    """36 candidates whose cost, written into the program, depends on the call's size."""

    op_id = "grid"

    def run(self, x, *, cfg, scale=1):
        with jax.named_scope(f"ktcost_{grid_cost(cfg, x.shape[0])}"):
            return jnp.sin(x) * scale

    def heuristic_cfg(self, inv):
        return GridCfg(1, 1)

    def candidate_cfgs(self, inv):
        return [GridCfg(a, b) for a in range(1, 7) for b in range(1, 7)]


def chain_for(tmp_path=None, **kw):
    persistent = None if tmp_path is None else kt.PersistentCache(tmp_path)
    return kt.ConfigSelectorChain(kt.ConfigCache(), tuner=cost_tuner(), persistent=persistent, **kw)


def tune(chain, n):
    k = GridKernel()
    inv = make_invocation(k, (rand((n, 8)),), {})
    return chain.decide(inv, k)


def test_a_second_size_warm_starts_from_the_first_and_finds_its_own_best():
    chain = chain_for()
    first = tune(chain, 64)
    assert first.report.strategy == "exhaustive" and first.cfg == GridCfg(3, 3)
    second = tune(chain, 128)
    assert second.report.strategy == "warm"
    assert second.cfg == GridCfg(4, 3)  # exhaustive search's winner for this size
    assert second.report.num_evaluated <= 0.25 * 36 + 1


def test_a_warm_start_reads_the_neighbours_in_the_persistent_cache(tmp_path):
    tune(chain_for(tmp_path), 64)
    (entry,) = kt.PersistentCache(tmp_path).entries()
    assert entry.shape is not None and entry.shape.sizes == (64, 8)
    fresh = tune(chain_for(tmp_path), 32)  # another process: nothing in memory
    assert fresh.report.strategy == "warm" and fresh.cfg == GridCfg(2, 3)


def test_the_shape_round_trips_through_an_entry_document_and_old_documents_have_none():
    shape = call_shapes.CallShape("fam", (3, 4))
    doc = kt.CacheEntry("grid@v0", "k", {"a": 1}, dev="cpu|cpu", shape=shape).to_document()
    assert entry_from_document(json.loads(json.dumps(doc)), "x").shape == shape
    del doc["shape"]
    assert entry_from_document(doc, "x").shape is None


# --- shipped tables ---------------------------------------------------------------------------


def write_table(path, entries):
    storage.write_export_file(str(path), [e.to_document() for e in entries], exported=0.0)
    return shipped.ShippedTables([path])


def test_a_shipped_entry_is_used_on_a_device_of_the_same_kind_and_seeds_warm_starts(tmp_path):
    k = GridKernel()
    inv = make_invocation(k, (rand((64, 8)),), {})
    dev = inv.device_fingerprint
    kind = shipped.device_kind_of(dev)
    table = write_table(
        tmp_path / "t.json",
        [
            kt.CacheEntry(
                inv.op_id_v, inv.call_key, {"a": 3, "b": 3}, dev=f"{kind}|another version",
                provenance="shipped", shape=inv.shape,
            )
        ],
    )  # fmt: skip
    chain = chain_for(shipped=table)
    d = chain.decide(inv, k)
    assert (d.tier, d.cfg, d.report) == ("shipped", GridCfg(3, 3), None)  # nothing tuned
    near = tune(chain, 128)
    assert near.report.strategy == "warm" and near.cfg == GridCfg(4, 3)


def test_a_table_for_another_device_kind_or_an_unreadable_one_is_not_used(tmp_path, caplog):
    k = GridKernel()
    inv = make_invocation(k, (rand((64, 8)),), {})
    other = write_table(
        tmp_path / "t.json",
        [kt.CacheEntry(inv.op_id_v, inv.call_key, {"a": 2, "b": 5}, dev="Another GPU|cuda 1")],
    )
    assert chain_for(shipped=other).decide(inv, k).tier == "autotune"
    (tmp_path / "bad.json").write_text("{not json")
    assert len(shipped.ShippedTables([tmp_path / "bad.json"])) == 0
    assert "Skipping the shipped kerneltune table" in caplog.text


def test_the_package_ships_readable_tables_for_the_h100_and_the_h200():
    # Moving the module once pointed PACKAGE_TABLES at a folder that does not exist:
    # every lookup then missed, silently.
    tables = shipped.package_tables()
    kinds = {shipped.device_kind_of(e.dev) for e in tables._index().values()}
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= kinds
    assert len(tables._index()) >= 100


@dataclasses.dataclass(frozen=True)
class BackendCfg:
    backend: str
    tile: int = 0


class TwoBackendKernel(kt.Kernel):
    """An XLA heuristic and two Pallas tiles, whose costs are written into the program:
    the Pallas ones cost `pallas_cost` (XLA costs 10)."""

    op_id = "two_backends"
    pallas_cost = 40

    def run(self, x, *, cfg):
        cost = 10 if cfg.backend == "xla" else self.pallas_cost + cfg.tile
        with jax.named_scope(f"ktcost_{cost}"):
            return jnp.sin(x)

    def heuristic_cfg(self, inv):
        return BackendCfg("xla")

    def candidate_cfgs(self, inv):
        return [BackendCfg("xla"), BackendCfg("pallas", 1), BackendCfg("pallas", 2)]


def shipped_neighbour(tmp_path, inv, pallas_ratio):
    """A table whose one entry is `inv`'s family at half its rows, Pallas that many
    times slower than XLA there."""
    kind = shipped.device_kind_of(inv.device_fingerprint)
    near = call_shapes.CallShape(inv.shape.family, (inv.shape.sizes[0] // 2, *inv.shape.sizes[1:]))
    timings = (
        {"cfg": {"backend": "xla", "tile": 0}, "status": "ok", "time_s": 1e-3},
        {"cfg": {"backend": "pallas", "tile": 1}, "status": "ok", "time_s": pallas_ratio * 1e-3},
        {"cfg": {"backend": "pallas", "tile": 2}, "status": "failed", "time_s": None},
    )
    entry = kt.CacheEntry(
        inv.op_id_v, "another key", {"backend": "xla", "tile": 0}, dev=f"{kind}|v",
        provenance="shipped", shape=near, timings=timings,
    )  # fmt: skip
    return write_table(tmp_path / "t.json", [entry])


def test_a_key_whose_nearest_shipped_neighbour_has_every_other_backend_far_behind_is_not_tuned(
    tmp_path,
):
    # A Pallas norm's training step 3.8x behind XLA's at the nearest shipped shape cost
    # each new size of a GPT block 1.7-1.9 s of tuning on an H100, and never wins.
    k = TwoBackendKernel()
    inv = make_invocation(k, (rand((64, 8)),), {})
    events = []
    chain = chain_for(
        shipped=shipped_neighbour(tmp_path, inv, 3.8),
        on_event=lambda event, **data: events.append(event),
    )
    d = chain.decide(inv, k)
    assert (d.tier, d.cfg, d.report) == ("shipped", BackendCfg("xla"), None)
    assert "autotune_start" not in events
    assert chain.decide(inv, k).tier == "memory"  # kept: the next call stops there


@pytest.mark.parametrize("ratio", [1.5, 1.99])
def test_a_contender_at_the_nearest_shipped_shape_is_still_tuned(tmp_path, ratio):
    k = TwoBackendKernel()
    k.pallas_cost = 5  # here the Pallas tiles are the faster
    inv = make_invocation(k, (rand((64, 8)),), {})
    chain = chain_for(shipped=shipped_neighbour(tmp_path, inv, ratio))
    d = chain.decide(inv, k)
    assert d.tier == "autotune" and d.cfg == BackendCfg("pallas", 1)
    assert ("shipped", "at the nearest shipped shape another backend is a contender") in d.misses


def test_ship_tables_missing_only_tunes_a_key_its_table_would_answer_from_a_neighbour(tmp_path):
    # `ship_tables --missing-only` exists to add the keys a table lacks, exhaustive
    # timings included; the chain's near answer would have left such a key out.
    from tools.ship_tables import ListedOnly

    k = TwoBackendKernel()
    inv = make_invocation(k, (rand((64, 8)),), {})
    table = shipped_neighbour(tmp_path, inv, 3.8)
    d = chain_for(shipped=ListedOnly(table)).decide(inv, k)
    assert d.tier == "autotune" and d.cfg == BackendCfg("xla")


class CountingEvaluator(FakeEvaluator):
    """Counts the batches (`evaluate` calls): each costs a compile latency on a GPU."""

    def __init__(self, time_of, workers):
        super().__init__(time_of)
        self.workers, self.batches = workers, []

    def evaluate(self, indices, rounds=None):
        self.batches.append(list(indices))
        return super().evaluate(indices, rounds)


@pytest.mark.parametrize("workers, batches", [(32, [16, 6]), (8, [10, 6, 6])])
def test_a_budget_that_compiles_at_once_fills_the_first_batch(workers, batches):
    # The budget is a quarter of the 108 configs (27). With 32 compile threads, the
    # first batch also takes the configs one step from the second hint and one field
    # from the first (16 configs, one compile latency): the best is among them, and
    # the climb needs one batch less. With 8 threads the first batch stays as it was.
    best = Tile(256, 128, 64, 8, 3)
    hints = (SPACE.index(Tile(64, 128, 64, 4, 3)), SPACE.index(Tile(256, 128, 64, 4, 3)))
    ev = CountingEvaluator(landscape(best), workers)
    warm_start.WarmStart(hints).search(ev)
    assert [len(b) for b in ev.batches] == batches
    assert (SPACE.index(best) in ev.batches[0]) == (workers == 32)
    assert SPACE.index(best) in ev.seen and len(ev.seen) <= 27
