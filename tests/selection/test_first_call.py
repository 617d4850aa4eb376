"""The first call of a key under a `FirstCallBudget` (`selection/first_call.py`): it
times only the candidates the prediction ranks best, within its seconds, records the
key as budgeted, and a later full tuning completes the search."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune._src.caching.tuned_neighbours import TimedCall
from kerneltune._src.core.call_shapes import CallShape
from kerneltune._src.selection import first_call, prediction, tiers
from kerneltune._src.tuning import distributed
from tests.helpers import RepCfg, cost_tuner
from tests.tuning.test_distributed import FakeKV, run_as_processes

pytestmark = pytest.mark.usefixtures("empty_registry")


class Reps(kt.Kernel):
    """Ten candidates whose cost (read by the cost timer) is `reps`; the heuristic (6)
    is neither the cheapest nor next to it in the candidates' order, so a shortlist
    made without neighbours misses the cheapest. Counts the configs it is traced with."""

    op_id = "first_call_reps"

    def __init__(self, sleep_s=0.0):
        super().__init__()
        self.sleep_s = sleep_s
        self.traced = collections.Counter()

    def run(self, x, *, cfg):
        self.traced[cfg.reps] += 1
        if cfg != self.heuristic_cfg(None):
            time.sleep(self.sleep_s)  # a slow build; the heuristic's is quick
        with jax.named_scope(f"ktcost_{cfg.reps}"):  # what the cost timer reads
            return x + 0.0 * jnp.sin(x)

    def heuristic_cfg(self, inv):
        return RepCfg(reps=6)

    def candidate_cfgs(self, inv):
        return [RepCfg(reps=r) for r in range(10, 0, -1)]


def budgeted_executor(events=None, persistent=None, **budget):
    # The timed path: trusting the prediction (the default) would skip it at any key
    # with a tuned neighbour.
    budget = {
        "candidates": 2,
        "key_s": 600.0,
        "process_s": 600.0,
        "trust_prediction": False,
        **budget,
    }
    on_event = None if events is None else (lambda e, **d: events.append((e, d)))
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(budget=kt.FirstCallBudget(**budget)),
        tuner=cost_tuner(progress=False),
        persistent=persistent,
        on_event=on_event,
    )
    return kt.Executor(chain)


def test_the_first_call_times_only_the_heuristic_and_the_shortlist():
    kernel, ex = Reps(), budgeted_executor()
    why = kt.explain(kernel, jnp.ones((8, 8)), executor=ex)
    assert why.tier == "autotune" and why.budgeted
    # No tuned neighbour: the heuristic and the 2 configs first in the candidates' order
    # (each one field from it); the 7 others are never built.
    assert [c.cfg for c in why.report.candidates] == [RepCfg(reps=r) for r in (6, 10, 9)]
    assert set(kernel.traced) == {6, 10, 9}
    assert why.cfg == RepCfg(reps=6) and why.report.budgeted
    assert "tuned under the first-call budget: timed the heuristic and the 2 other" in str(why)


def test_the_budget_bounds_the_first_call():
    # Each config but the heuristic takes 2 s to build (JAX lowers one at a time): the
    # shortlist alone would take 3 x 2 s, the whole space 9 x 2 s.
    kernel = Reps(sleep_s=2.0)
    ex = budgeted_executor(candidates=3, key_s=1.5)
    start = time.perf_counter()
    why = kt.explain(kernel, jnp.ones((8, 8)), executor=ex)
    took = time.perf_counter() - start
    report = why.report
    assert took < 1.5 + 2.5, took
    assert report.wall_s < 1.5 + 1.0, report.wall_s
    assert why.tier == "autotune" and why.cfg == RepCfg(reps=6) and why.budgeted
    late = [c for c in report.candidates if c.status == "pruned"]
    assert late and all("time budget ran out" in c.error for c in late)
    assert "not run within 1.50 s" in why.budget
    # What ran in time is cached as budgeted, and served from memory from then on.
    assert ex.chooser.cache.is_budgeted(why.device, why.op_id_v, why.call_key)
    assert kt.explain(kernel, jnp.ones((8, 8)), executor=ex).tier == "memory"


def _report(best, statuses):
    results = [SimpleNamespace(cfg=RepCfg(reps=r), status=st) for r, st in statuses]
    return SimpleNamespace(best=None if best is None else RepCfg(reps=best), candidates=results)


def test_a_budget_that_cuts_the_first_choice_keeps_it_rather_than_a_faster_building_one():
    """Seen on an H200 (attention with a bias, 2026-11-27): tokamax, the heuristic,
    compiled for 7.8 s against a 5 s budget, cuDNN was timed alone and won, at 1.4x
    tokamax's step. The chain then uses the prediction untimed (`_first_call`)."""
    plan = first_call.Plan(
        prediction=None, space=(RepCfg(reps=1), RepCfg(reps=2)),
        shortlist=(RepCfg(reps=1), RepCfg(reps=2)), untimed=(RepCfg(reps=1),),
    )  # fmt: skip
    assert first_call.first_choice_untimed(plan, _report(2, [(1, "pruned"), (2, "ok")]))
    # The first choice timed and beaten, or failed: the timed winner stands.
    assert not first_call.first_choice_untimed(plan, _report(2, [(1, "ok"), (2, "ok")]))
    assert not first_call.first_choice_untimed(plan, _report(2, [(1, "failed"), (2, "ok")]))
    assert not first_call.first_choice_untimed(plan, _report(1, [(1, "ok"), (2, "pruned")]))


def test_a_prediction_from_tuned_calls_nearby_is_used_untimed_by_default():
    events = []
    kernel = Reps()
    ex = budgeted_executor(events, trust_prediction=True)
    # No tuned call nearby: the first key times its shortlist, as before...
    first = kt.explain(kernel, jnp.ones((8, 8)), executor=ex)
    assert first.tier == "autotune" and first.cfg == RepCfg(reps=6) and first.budgeted
    # ...and a key next to it takes that winner untimed: no candidate built or timed.
    kernel.traced.clear()
    events.clear()
    second = kt.explain(kernel, jnp.ones((8, 16)), executor=ex)
    assert second.tier == "predicted" and second.cfg == RepCfg(reps=6)
    assert not kernel.traced
    assert not [e for e, _ in events if e.startswith("autotune")]
    assert "rests on timings of tuned calls nearby" in second.budget
    assert "KERNELTUNE_FIRST_CALL_TRUST_PREDICTION" in second.budget
    # Untimed configs are never cached: a full tuning still tunes the key.
    assert ex.chooser.cache.get(second.device, second.op_id_v, second.call_key) is None


def test_once_the_process_budget_is_spent_new_keys_use_their_prediction_untimed():
    events = []
    kernel = Reps()
    ex = budgeted_executor(events, candidates=3)
    first = kt.explain(kernel, jnp.ones((8, 8)), executor=ex)
    assert first.tier == "autotune"
    # Timed there: the heuristic (6) and 10, 9, 8; 6 was the fastest of them.
    kernel.traced.clear()
    events.clear()
    spent = kt.FirstCallBudget(candidates=3, process_s=1e-6, trust_prediction=False)
    with kt.policy_override(ex, budget=spent):
        second = kt.explain(kernel, jnp.ones((8, 16)), executor=ex)
    assert second.tier == "predicted" and second.cfg == RepCfg(reps=6)
    assert "this process has spent its first-call tuning budget" in second.budget
    assert "predicted from 1 tuned call(s) nearest in size (8x8)" in second.budget
    assert [e for e, _ in events] == ["predicted"]  # nothing timed
    assert not ex.chooser.cache.get(second.device, second.op_id_v, second.call_key)
    assert "from:     a prediction from tuned calls nearby (untimed)" in str(second)
    # The same key again: the same prediction, still untimed and uncached.
    again = kt.explain(kernel, jnp.ones((8, 16)), executor=ex)
    assert again.tier == "predicted" and again.cfg == second.cfg
    assert set(kernel.traced) <= {6}  # traced to check it, never benchmarked


def _granted(monkeypatch):
    """The seconds each budgeted tuning was given: its time budget plus the first
    choice's grace (as long again where the tuner names none)."""
    granted = []
    real = first_call.budget_tuner

    def budget_tuner(*args):
        tuner = real(*args)
        grace = getattr(tuner, "first_grace_s", None)
        granted.append(tuner.time_budget_s + (tuner.time_budget_s if grace is None else grace))
        return tuner

    monkeypatch.setattr(first_call, "budget_tuner", budget_tuner)
    return granted


def test_a_key_started_near_the_end_of_the_process_budget_gets_only_what_is_left(
    monkeypatch,
):
    # Before: a key started while any of the process's seconds were left got its whole
    # key_s, and its first choice as long again: 2.6 s spent of a 1.5 s budget.
    granted = _granted(monkeypatch)
    kernel = Reps(sleep_s=0.8)
    ex = budgeted_executor(candidates=3, key_s=1.0, process_s=1.5)
    ledger = ex.chooser._tuned.first_calls
    assert kt.explain(kernel, jnp.ones((8, 8)), executor=ex).tier == "autotune"
    spent = ledger.spent_s
    why = kt.explain(kernel, jnp.ones((8, 16)), executor=ex)
    if spent < 1.5:  # a loaded machine may have spent it all on the first key
        # Timed within what was left (too little, maybe, for its first choice to
        # build: then it is used untimed).
        assert why.tier in ("autotune", "predicted") and len(granted) == 2, why
        assert granted[1] <= 1.5 - spent + 1e-6, (granted, spent)
    # Whatever is spent then, nothing more is timed.
    third = kt.explain(kernel, jnp.ones((8, 32)), executor=ex)
    assert third.tier == "predicted" and "spent its first-call tuning budget" in third.budget


def test_threads_missing_other_keys_at_once_share_the_process_budget(monkeypatch):
    # Before: each thread saw nothing spent yet and took a whole key's seconds.
    granted = _granted(monkeypatch)
    started = threading.Event()
    events = []

    def on_event(event, **data):
        events.append(event)
        if event == "autotune_start":
            started.set()

    kernel = Reps(sleep_s=1.0)
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(
            budget=kt.FirstCallBudget(
                candidates=3, key_s=2.0, process_s=3.0, trust_prediction=False
            )
        ),
        tuner=cost_tuner(progress=False),
        on_event=on_event,
    )
    ex = kt.Executor(chain)
    whys = {}
    first = threading.Thread(
        target=lambda: whys.update(a=kt.explain(kernel, jnp.ones((8, 8)), executor=ex))
    )
    first.start()
    assert started.wait(60)
    # The first key's tuning is under way with 2 s and 1 s of grace: nothing is left.
    whys["b"] = kt.explain(kernel, jnp.ones((8, 16)), executor=ex)
    first.join(60)
    assert whys["a"].tier == "autotune" and granted == [3.0], granted
    assert whys["b"].tier == "predicted", whys["b"]
    assert "spent or under way" in whys["b"].budget


def tuned_neighbour(tmp_path, kernel, times, best=3):
    """A persistent cache holding `kernel`'s call at 8 x 8, tuned with `times` (reps:
    seconds, None: failed) and `best` the winner: the neighbour a prediction reads."""
    cache = kt.PersistentCache(tmp_path)
    inv = kt.Executor(kt.ConfigSelectorChain()).invocation(kernel, jnp.ones((8, 8)))
    report = kt.TuningReport(
        best=RepCfg(reps=best),
        candidates=tuple(
            kt.CandidateResult(cfg=RepCfg(reps=r), time_s=t)
            if t
            else kt.CandidateResult(cfg=RepCfg(reps=r), status="run_error", error="boom")
            for r, t in times.items()
        ),
        timer="cost-in-program",
    )
    cache.put(
        kt.device_fingerprint(), inv.op_id_v, inv.call_key, RepCfg(reps=best),
        report=report, shape=inv.shape,
    )  # fmt: skip
    return cache


class Faster(Reps):
    """Reps whose cheapest config was recorded at a neighbouring size."""

    op_id = "first_call_faster"


def test_an_untimed_prediction_follows_the_tuned_neighbours(tmp_path):
    cache = tuned_neighbour(tmp_path, Faster(), {3: 1e-3, 6: 2e-3, 1: None})
    ex = budgeted_executor(persistent=cache, candidates=0)
    why = kt.explain(Faster(), jnp.ones((8, 32)), executor=ex)
    assert why.tier == "predicted" and why.cfg == RepCfg(reps=3)
    assert "KERNELTUNE_FIRST_CALL_CANDIDATES=0" in why.budget


class Ordered(Reps):
    """Reps for a test of the order in which a first call times its shortlist."""

    op_id = "first_call_ordered"


def test_a_budgeted_first_call_times_the_predicted_choice_before_the_heuristic(tmp_path):
    """A budget that runs out times only the shortlist's first configs: on an H200 the
    grouped matmul's heuristic, timed first, was the only config timed at 128 and 64
    experts, at 52% and 38% over the fastest, where the config the neighbours predicted
    cost 7%. So the prediction's choice goes first, the heuristic second."""
    cache = tuned_neighbour(tmp_path, Ordered(), {3: 1e-3, 6: 2e-3})
    why = kt.explain(Ordered(), jnp.ones((8, 32)), executor=budgeted_executor(persistent=cache))
    assert why.tier == "autotune" and why.cfg == RepCfg(reps=3)
    order = [c.cfg.reps for c in why.report.candidates]
    assert order[:2] == [3, 6] and len(order) == 3
    assert "timed the config predicted fastest, the heuristic and 1 other" in why.budget


class SlowFirst(Reps):
    """Reps whose config 3, the neighbours' winner, takes `sleep_s` to build; the
    others build at once."""

    op_id = "first_call_slow_first"

    def run(self, x, *, cfg):
        self.traced[cfg.reps] += 1
        if cfg.reps == 3:
            time.sleep(self.sleep_s)
        with jax.named_scope(f"ktcost_{cfg.reps}"):
            return x + 0.0 * jnp.sin(x)


def test_the_first_choice_is_waited_for_as_long_again_as_the_budget(tmp_path):
    """On an H200 the grouped matmul's predicted Triton tile did not build within the
    key's 5 s at 128 and 256 experts; the first call then used it untimed (42% off the
    best at 256 experts, where the timed heuristic was 21%). The first choice now gets
    as long again: built in time, it is timed and the faster of it and the heuristic
    wins; still building then, it is given up as before."""
    cache = tuned_neighbour(tmp_path, SlowFirst(), {3: 1e-3, 6: 2e-3})
    ex = budgeted_executor(persistent=cache, key_s=2.0)
    start = time.perf_counter()
    why = kt.explain(SlowFirst(sleep_s=2.5), jnp.ones((8, 32)), executor=ex)
    took = time.perf_counter() - start
    assert why.tier == "autotune" and why.cfg == RepCfg(reps=3), why
    status = {c.cfg.reps: c.status for c in why.report.candidates}
    assert status[3] == "ok" and status[6] == "ok"
    assert took < 4.0 + 2.5, took

    # A build longer than twice the budget can never be in time, however loaded the
    # machine: a shorter budget here only shortens the test.
    cache = tuned_neighbour(tmp_path / "b", SlowFirst(), {3: 1e-3, 6: 2e-3})
    ex = budgeted_executor(persistent=cache, key_s=1.0)
    start = time.perf_counter()
    why = kt.explain(SlowFirst(sleep_s=2.5), jnp.ones((8, 32)), executor=ex)
    took = time.perf_counter() - start
    # Not built by twice the budget: given up, and the prediction is used untimed
    # (tracing it again for the call takes its 2.5 s once more).
    assert why.tier == "predicted" and why.cfg == RepCfg(reps=3)
    assert "was not timed within the first-call budget" in why.budget
    assert took < 2.0 + 2.5 + 2.5, took


class Untraceable(Reps):
    """Its config 3 cannot be traced at this size (a block too large, say)."""

    op_id = "first_call_untraceable"

    def run(self, x, *, cfg):
        if cfg.reps == 3:
            raise ValueError("block larger than the array")
        return super().run(x, cfg=cfg)


def test_an_untimed_prediction_that_fails_to_trace_gives_way(tmp_path):
    cache = tuned_neighbour(tmp_path, Untraceable(), {3: 1e-3, 5: 1.5e-3, 6: 3e-3})
    ex = budgeted_executor(persistent=cache, candidates=0)
    why = kt.explain(Untraceable(), jnp.ones((8, 32)), executor=ex)
    assert why.tier == "predicted" and why.cfg == RepCfg(reps=5)


def test_a_budgeted_key_is_completed_by_a_later_full_tune(tmp_path):
    kernel = Reps()
    cache = kt.PersistentCache(tmp_path)
    ex = budgeted_executor(persistent=cache)
    x = jnp.ones((8, 8))
    first = kt.explain(kernel, x, executor=ex)
    key = (first.device, first.op_id_v, first.call_key)
    assert first.cfg == RepCfg(reps=6) and first.budgeted
    entry = cache.get_entry(*key)
    assert entry.budgeted and len(entry.candidates) == 3
    # A budget policy does not tune it again: its memory and persistent caches hold it.
    ex.chooser.cache.clear()
    again = kt.explain(kernel, x, executor=ex)
    assert again.tier == "persistent" and again.budgeted and again.cfg == RepCfg(reps=6)
    # A full tuning of a function calling the kernel (`kt.autotune(step)`) searches the
    # whole space for the key, in memory and on disk.
    kt.set_default_executor(ex)
    try:
        result = kt.autotune(lambda x: kernel(x) * 2.0, x)
    finally:
        kt.set_default_executor(None)
    (tuned,) = list(result)
    assert tuned.cfg == RepCfg(reps=1) and len(tuned.timings) == 10
    assert ex.chooser.cache.get(*key) == RepCfg(reps=1)
    assert not ex.chooser.cache.is_budgeted(*key)
    entry = cache.get_entry(*key)
    assert not entry.budgeted and entry.cfg == {"reps": 1} and len(entry.candidates) == 10
    after = kt.explain(kernel, x, executor=ex)
    assert after.tier == "memory" and after.cfg == RepCfg(reps=1) and not after.budgeted


def test_a_full_search_policy_completes_a_budgeted_entry_of_the_persistent_cache(tmp_path):
    kernel = Reps()
    cache = kt.PersistentCache(tmp_path)
    x = jnp.ones((8, 8))
    assert kt.explain(kernel, x, executor=budgeted_executor(persistent=cache)).budgeted
    # Another process with the budget reads the budgeted entry as it is...
    same = kt.explain(kernel, x, executor=budgeted_executor(persistent=cache))
    assert same.tier == "persistent" and same.budgeted and "budget:" in str(same)
    assert "under a first-call budget" in str(same)
    # ...one that searches in full (KERNELTUNE_FIRST_CALL_CANDIDATES=all, `kerneltune
    # tune`) completes it, and its entry replaces the budgeted one.
    full = kt.Executor(
        kt.ConfigSelectorChain(kt.ConfigCache(), tuner=cost_tuner(progress=False), persistent=cache)
    )
    why = kt.explain(kernel, x, executor=full)
    assert why.tier == "autotune" and why.cfg == RepCfg(reps=1) and not why.budgeted
    assert ("persistent", tiers.COMPLETING) in why.misses
    entry = cache.get_entry(why.device, why.op_id_v, why.call_key)
    assert not entry.budgeted and entry.cfg == {"reps": 1}
    # A budget policy now finds a full entry.
    later = kt.explain(kernel, x, executor=budgeted_executor(persistent=cache))
    assert later.tier == "persistent" and later.cfg == RepCfg(reps=1) and not later.budgeted


def test_a_space_the_shortlist_covers_is_not_budgeted():
    class Small(Reps):
        op_id = "first_call_small"

        def candidate_cfgs(self, inv):
            return [RepCfg(reps=r) for r in (9, 6, 2)]

    why = kt.explain(Small(), jnp.ones((8, 8)), executor=budgeted_executor(candidates=3))
    assert why.tier == "autotune" and why.cfg == RepCfg(reps=2)
    assert not why.budgeted and not why.report.budgeted and "budget:" not in str(why)


def test_the_default_policy_takes_its_budget_from_the_options(monkeypatch):
    for name in ("CANDIDATES", "KEY_S", "PROCESS_S"):
        monkeypatch.delenv(f"KERNELTUNE_FIRST_CALL_{name}", raising=False)
    monkeypatch.delenv("KERNELTUNE_FIRST_CALL_TRUST_PREDICTION", raising=False)
    assert kt.AutotunePolicy.from_env().budget == kt.FirstCallBudget(
        candidates=3, key_s=5.0, process_s=20.0, trust_prediction=True
    )
    assert kt.AutotunePolicy().budget is None  # a chain built by hand searches in full
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_CANDIDATES", "1")
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_KEY_S", "2.5")
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_PROCESS_S", "inf")
    budget = kt.AutotunePolicy.from_env().budget
    assert budget == kt.FirstCallBudget(candidates=1, key_s=2.5, process_s=float("inf"))
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_CANDIDATES", "all")
    assert kt.AutotunePolicy.from_env().budget is None
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_TRUST_PREDICTION", "0")
    assert kt.AutotunePolicy.from_env().budget is None  # CANDIDATES=all still rules
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_CANDIDATES", "3")
    assert kt.AutotunePolicy.from_env().budget.trust_prediction is False
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_CANDIDATES", "-1")
    with pytest.raises(ValueError, match=r"KERNELTUNE_FIRST_CALL_CANDIDATES='-1'.*or all"):
        kt.AutotunePolicy.from_env()
    with pytest.raises(ValueError, match="key_s must be a positive number"):
        kt.FirstCallBudget(key_s=0)
    with pytest.raises(TypeError, match="trust_prediction must be a bool, got 'yes'"):
        kt.FirstCallBudget(trust_prediction="yes")
    with pytest.raises(TypeError, match="budget must be a FirstCallBudget"):
        kt.AutotunePolicy(budget=3)


def test_a_policy_override_can_lift_the_budget():
    ex = budgeted_executor()
    with kt.policy_override(ex, budget=None):
        why = kt.explain(Reps(), jnp.ones((8, 8)), executor=ex)
    assert why.tier == "autotune" and why.cfg == RepCfg(reps=1) and not why.budgeted


# -- every process of a job follows one plan ---------------------------------------------


def plan_of(sizes_fast, spent_s=0.0, process_s=100.0, trust=False):
    """A plan for one key whose nearest tuned call found `sizes_fast` fastest (None:
    no tuned call nearby)."""
    space = [RepCfg(reps=r) for r in range(1, 9)]
    calls = (
        [TimedCall(CallShape("f", (8, 8)), {"reps": sizes_fast}, (({"reps": sizes_fast}, 1e-3),))]
        if sizes_fast is not None
        else []
    )
    predicted = prediction.predict((8, 16), space, RepCfg(reps=6), calls)
    budget = kt.FirstCallBudget(candidates=2, process_s=process_s, trust_prediction=trust)
    return first_call.plan(predicted, space, budget, spent_s)


def test_processes_time_process_zeros_shortlist(monkeypatch):
    # Their persistent caches differ, so their predictions do; they must still time
    # the same candidates (or agreeing on a winner fails) and use the same config.
    local = threading.local()
    monkeypatch.setattr(distributed, "current_peers", lambda: local.peers)
    key = ("cpu|cpu", "op@v0", "k")

    def body(peers):
        local.peers = peers
        mine = plan_of(sizes_fast=2 if peers.process_id == 0 else 7)
        return first_call.agreed(key, mine, what="op")

    plans = run_as_processes(2, body, FakeKV())
    # Process 0's: its prediction's choice (2), the heuristic (6), then the next (1).
    assert [p.shortlist for p in plans] == [(RepCfg(reps=2), RepCfg(reps=6), RepCfg(reps=1))] * 2
    assert plans[0].untimed == plans[1].untimed and not plans[1].why_untimed


def test_no_process_times_when_one_has_spent_its_budget(monkeypatch):
    local = threading.local()
    monkeypatch.setattr(distributed, "current_peers", lambda: local.peers)
    key = ("cpu|cpu", "op@v0", "k2")

    def body(peers):
        local.peers = peers
        spent = 200.0 if peers.process_id == 1 else 0.0
        return first_call.agreed(key, plan_of(sizes_fast=2, spent_s=spent), what="op")

    plans = run_as_processes(2, body, FakeKV())
    assert all(p.shortlist == () for p in plans)
    assert all("spent its first-call tuning budget" in p.why_untimed for p in plans)
    assert plans[0].untimed[0] == plans[1].untimed[0] == RepCfg(reps=2)


def test_a_process_that_trusts_its_prediction_makes_every_process_use_process_zeros(
    monkeypatch,
):
    # Process 1 has a tuned call nearby, process 0 none: nobody times, and both use
    # process 0's untimed order (its heuristic first), so their programs agree.
    local = threading.local()
    monkeypatch.setattr(distributed, "current_peers", lambda: local.peers)
    key = ("cpu|cpu", "op@v0", "k4")

    def body(peers):
        local.peers = peers
        near = None if peers.process_id == 0 else 2
        return first_call.agreed(key, plan_of(sizes_fast=near, trust=True), what="op")

    plans = run_as_processes(2, body, FakeKV())
    assert all(p.shortlist == () for p in plans)
    assert all("rests on timings of tuned calls nearby" in p.why_untimed for p in plans)
    assert plans[0].untimed[0] == plans[1].untimed[0] == RepCfg(reps=6)


def test_one_process_keeps_its_own_plan():
    mine = plan_of(sizes_fast=2)
    assert first_call.agreed(("cpu|cpu", "op@v0", "k3"), mine, what="op") is mine
    assert dataclasses.replace(mine, shortlist=mine.space).partial is False


def _predicted_with(monkeypatch, kernel, args, kwargs):
    """What `first_call.predict_call` hands the prediction for a call of `kernel`."""
    from kerneltune._src.kernel.base import make_invocation

    seen = {}

    def predict(sizes, candidates, heuristic, calls, padded_work=None, across_sizes=None):
        seen.update(sizes=sizes, padded_work=padded_work, across_sizes=across_sizes)
        return prediction.Prediction(
            ranked=tuple(candidates), slowdowns=(None,) * len(candidates), heuristic=None
        )

    monkeypatch.setattr(prediction, "predict", predict)
    inv = make_invocation(kernel, args, kwargs)
    first_call.predict_call(
        inv, kernel, ("dev", kernel.op_id_v), [], local=None, persistent=None, shipped=None
    )
    return seen


def test_the_prediction_of_a_bundled_kernel_takes_its_tiles_work_model(monkeypatch):
    from kerneltune.kernels.ragged_dot.api import RaggedDotGradLhs

    args = (
        jax.ShapeDtypeStruct((256, 96), jnp.bfloat16),
        jax.ShapeDtypeStruct((4, 64, 96), jnp.bfloat16),
        jax.ShapeDtypeStruct((4,), jnp.int32),
    )
    seen = _predicted_with(monkeypatch, RaggedDotGradLhs(), args, {"out_dtype": "bfloat16"})
    assert seen["sizes"] == (256, 96, 4, 64, 96, 4)
    cfg = {"backend": "triton", "block_m": 64, "block_n": 128, "block_k": 32}
    # d_lhs[256, 64] in tiles of 64 x 128: twice the columns.
    assert seen["padded_work"](cfg, seen["sizes"]) == pytest.approx(2.0)


def test_the_prediction_of_the_loss_head_matches_one_chunk_at_any_length(monkeypatch):
    from kerneltune.kernels.cross_entropy.api import LinearSoftmaxCrossEntropy

    args = (
        jax.ShapeDtypeStruct((4096, 64), jnp.bfloat16),
        jax.ShapeDtypeStruct((4096,), jnp.int32),
        jax.ShapeDtypeStruct((64, 1000), jnp.bfloat16),
        jax.ShapeDtypeStruct((4096,), jnp.bool_),
    )
    seen = _predicted_with(monkeypatch, LinearSoftmaxCrossEntropy(), args, {})
    across = seen["across_sizes"]
    one = {"backend": "chunked", "chunk_size": 4096, "logits_dtype": "input"}
    at_16k = (16384, 64, 16384, 64, 1000, 16384)
    assert across(one, seen["sizes"]) == across({**one, "chunk_size": 16384}, at_16k)
    assert across(one, at_16k)["chunk_size"] == 4096  # four chunks there
