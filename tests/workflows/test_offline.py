"""Offline tuning: autotune_lowered / autotune_recorded and AutotuningResult."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.kernel import recording
from kerneltune._src.workflows import offline
from tests.helpers import rand
from tests.offline_kernels import (
    CANDIDATES,
    CHEAPEST,
    HEURISTIC,
    LoopCfg,
    LoopKernel,
    SinKernel,
    tuning_executor,
)

pytestmark = pytest.mark.usefixtures("empty_registry")


def chain_with_events(persistent=None, fallback="heuristics"):
    executor, events = tuning_executor(fallback, persistent)
    return executor.chooser, events


def count(events, name):
    return sum(1 for e, _ in events if e == name)


def make_model(ex, kernel):
    def model(x):
        y = ex(kernel, x, alpha=0.5)
        z = ex(kernel, y[:96, :96])
        return jnp.sum(z) + jnp.sum(y)

    return model


def reference(x):
    y = x * 0.5
    return jnp.sum(y[:96, :96]) + jnp.sum(y)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The main workflow, once: record eagerly, lower, tune offline."""
    recording.clear_invocations()
    persistent = PersistentCache(tmp_path_factory.mktemp("cache"))
    chain, events = chain_with_events(persistent)
    ex, kernel = kt.Executor(chain), LoopKernel()
    model = make_model(ex, kernel)
    x = rand((128, 128), seed=0)
    with recording.record_calls():
        model(x)  # heuristics only: nothing is tuned at run time
    assert count(events, "autotune_start") == 0
    lowered = jax.jit(model).lower(x)
    result = offline.autotune_lowered(chain, lowered)
    records = recording.get_invocations()
    recording.clear_invocations()
    return result, chain, events, persistent, records, x


def test_autotune_lowered_tunes_both_calls_with_the_cheapest_configs(tuned):
    result, chain, events, persistent, records, _ = tuned
    assert len(result) == 2
    assert count(events, "autotune_start") == 2
    dev = kt.device_fingerprint()
    assert result.device == dev
    assert {(e.op_id_v, e.call_key) for e in result} == {
        ("loop@v0", key) for key in records["loop@v0"]
    }
    for entry in result:
        assert entry.cfg == CHEAPEST
        assert sorted(t["cfg"]["reps"] for t in entry.timings) == sorted(c.reps for c in CANDIDATES)
        assert all(t["status"] == "ok" and t["time_s"] > 0 for t in entry.timings)
        assert entry.best_time_s == min(t["time_s"] for t in entry.timings)
        assert entry.signature in ("f32[128,128], alpha=0.5", "f32[96,96]")
        # The winners are in the memory and the persistent cache.
        assert chain.cache.get(dev, entry.op_id_v, entry.call_key) == CHEAPEST
        assert persistent.get(dev, entry.op_id_v, entry.call_key, cfg_type=LoopCfg) == CHEAPEST


def test_with_result_the_executor_uses_the_tuned_configs(tuned):
    result, *_, x = tuned
    fresh, events = chain_with_events()  # its own empty caches, heuristics on a miss
    ex = kt.Executor(fresh)
    model = make_model(ex, LoopKernel())
    with result:
        inside = jax.jit(model)(x)
        assert ex.choose_config(LoopKernel(), x, alpha=0.5) == CHEAPEST
    assert count(events, "overlay_hit") == 3 and count(events, "heuristics") == 0
    assert all(d["cfg"] == CHEAPEST for e, d in events if e == "overlay_hit")
    assert ex.choose_config(LoopKernel(), x, alpha=0.5) == HEURISTIC
    np.testing.assert_allclose(inside, reference(x), rtol=1e-5)


def test_result_survives_dumps_loads_and_save_load(tuned, tmp_path):
    result = tuned[0]
    again = kt.AutotuningResult.loads(result.dumps(), {"loop": LoopCfg})
    assert again == result
    path = tmp_path / "result.json"
    result.save(path)
    assert kt.AutotuningResult.load(path, {"loop@v0": LoopCfg}) == result
    plain = kt.AutotuningResult.load(path)  # no types: configs stay field dicts
    assert all(e.cfg == {"reps": CHEAPEST.reps} for e in plain)
    fresh, events = chain_with_events()
    ex = kt.Executor(fresh)
    with plain:  # the chain rebuilds the kernel's config type
        assert ex.choose_config(LoopKernel(), tuned[-1], alpha=0.5) == CHEAPEST


def test_result_file_imports_into_a_persistent_cache(tuned, tmp_path):
    result = tuned[0]
    path = tmp_path / "result.json"
    result.save(path)
    other = PersistentCache(tmp_path / "other")
    assert other.import_(path) == 2
    for e in result:
        assert other.get(result.device, e.op_id_v, e.call_key, cfg_type=LoopCfg) == CHEAPEST
        stored = other.get_entry(result.device, e.op_id_v, e.call_key)
        assert len(stored.candidates) == len(CANDIDATES) and stored.provenance == "imported"


def test_merge_len_iteration_and_devices():
    a = kt.AutotuningResult(
        "d", (kt.Entry("op@v0", "k1", {"b": 1}), kt.Entry("op@v0", "k2", {"b": 2}))
    )
    b = kt.AutotuningResult("d", (kt.Entry("op@v0", "k2", {"b": 3}),))
    merged = a | b
    assert len(merged) == 2 and [e.call_key for e in merged] == ["k1", "k2"]
    assert merged.get("op@v0", "k2").cfg == {"b": 3}
    with pytest.raises(ValueError, match="different devices"):
        a | kt.AutotuningResult("other", ())
    both = kt.AutotuningResult.loads(a.dumps()) | kt.AutotuningResult.loads(b.dumps())
    assert both == merged
    with pytest.raises(ValueError, match="not an AutotuningResult"):
        kt.AutotuningResult.loads('{"kind": "something"}')


def test_a_result_built_by_hand_round_trips_and_compares_equal(tmp_path):
    # Built from a list, a result was unhashable and unequal to the same result built
    # from a tuple; with a config instance, `loads(dumps())` filled in `cfg_type` (an
    # informational field) and so compared unequal to the result it was dumped from.
    entries = [kt.Entry("loop@v0", "k1", LoopCfg(reps=2)), kt.Entry("loop@v0", "k2", CHEAPEST)]
    result = kt.AutotuningResult("d", entries)
    assert isinstance(result.entries, tuple)
    assert result == kt.AutotuningResult("d", tuple(entries))
    assert hash(result) == hash(kt.AutotuningResult("d", tuple(entries)))
    assert kt.AutotuningResult.loads(result.dumps(), {"loop": LoopCfg}) == result
    result.save(tmp_path / "r.json")
    again = kt.AutotuningResult.load(tmp_path / "r.json", {"loop@v0": LoopCfg})
    assert again == result
    assert [e.cfg_type for e in again] == [f"{LoopCfg.__module__}.LoopCfg"] * 2
    assert (result | kt.AutotuningResult("d", [])) == result


def test_forward_and_backward_kernels_get_their_own_configs():
    chain, events = chain_with_events()
    ex = kt.Executor(chain)
    fwd = SinKernel(executor=ex)

    def loss(x):
        return jnp.sum(ex(fwd, x) ** 2)

    x = rand((64, 64), seed=1)
    with recording.record_calls():
        jax.grad(loss)(x)
    recorded = recording.get_invocations()
    assert set(recorded) == {"sin_fwd@v0", "sin_bwd@v0"}
    result = offline.autotune_lowered(chain, jax.jit(jax.value_and_grad(loss)).lower(x))
    assert sorted(e.op_id_v for e in result) == ["sin_bwd@v0", "sin_fwd@v0"]
    assert all(e.cfg == CHEAPEST and len(e.timings) == 3 for e in result)
    tuned_keys = {(d["op_id"], d["call_key"]) for e, d in events if e == "autotune_start"}
    assert tuned_keys == {(e.op_id_v, e.call_key) for e in result}
    with result:
        value, grad = jax.jit(jax.value_and_grad(loss))(x)
    np.testing.assert_allclose(grad, 2 * jnp.sin(x) * jnp.cos(x), rtol=1e-4, atol=1e-5)


def test_autotune_recorded_reuses_cached_winners_unless_forced():
    chain, events = chain_with_events()
    ex, kernel = kt.Executor(chain), LoopKernel()
    with recording.record_calls():
        ex(kernel, jnp.ones((64, 64)))
    first = kt_result = offline.autotune_recorded(selector=ex)
    assert len(kt_result) == 1 and count(events, "autotune_start") == 1
    again = offline.autotune_recorded(selector=chain)
    assert count(events, "autotune_start") == 1  # cached: not benchmarked again
    assert [e.cfg for e in again] == [e.cfg for e in first]
    assert len(again.entries[0].timings) == 3  # the report from the first tuning
    offline.autotune_recorded(selector=chain, force=True)
    assert count(events, "autotune_start") == 2


def test_calls_that_cannot_be_tuned_are_reported_not_raised(caplog):
    class Local(LoopKernel):
        op_id = "local_untunable"

        def candidate_cfgs(self, inv):
            raise RuntimeError("no candidates today")

    chain, _ = chain_with_events()
    ex = kt.Executor(chain)
    with recording.record_calls():
        ex(Local(), jnp.ones((4, 4)))
        ex(LoopKernel(), jnp.ones((4, 4)))
    outcomes = offline.tune_records(recording.iter_records(recording.get_invocations()), chain)
    status = {o.record.op_id_v: o.status for o in outcomes}
    assert status == {"local_untunable@v0": "failed", "loop@v0": "tuned"}
    assert "no candidates today" in caplog.text
    assert len(offline.result_of(outcomes)) == 1


def test_unrecorded_calls_in_a_lowered_computation_are_named(caplog):
    chain, _ = chain_with_events()
    ex = kt.Executor(chain)
    lowered = jax.jit(lambda x: ex(LoopKernel(), x)).lower(jnp.ones((4, 4)))
    assert len(offline.autotune_lowered(chain, lowered)) == 0
    assert "never recorded" in caplog.text and "loop@v0:" in caplog.text
    assert len(offline.autotune_lowered(chain, jax.jit(jnp.sin).lower(jnp.ones(2)))) == 0
    assert "found no kerneltune call" in caplog.text


def test_a_step_jitted_before_tuning_picks_up_the_tuned_configs_once():
    # Issue 13.2: after autotune_lowered, a train step jitted (and run) before it must
    # trace once more with the tuned configs, without `with result:` or clear_caches.
    recording.clear_invocations()
    chain, events = chain_with_events()
    ex, kernel = kt.Executor(chain), LoopKernel()
    traces = []

    def model(x):
        traces.append(1)
        return make_model(ex, kernel)(x)

    step = jax.jit(model)
    x = rand((128, 128), seed=0)
    with recording.record_calls():
        step(x)  # heuristics: nothing is tuned at run time
    assert count(events, "heuristics") == 2 and len(traces) == 1
    offline.autotune_lowered(chain, step.lower(x))
    recording.clear_invocations()
    before = count(events, "cache_hit")
    np.testing.assert_allclose(step(x), reference(x), rtol=1e-5)
    assert len(traces) == 3  # one for lower(), one for the retrace with tuned configs
    assert count(events, "cache_hit") == before + 2
    step(x)
    step(x)
    assert len(traces) == 3  # and only once


def record_loop_calls(ex, sizes):
    kernel = LoopKernel()
    with recording.record_calls():
        for n in sizes:
            ex(kernel, jnp.ones((n, n)))
    records = list(recording.iter_records(recording.get_invocations()))
    recording.clear_invocations()
    return records


def test_a_key_from_the_shipped_tables_counts_as_cached(tmp_path):
    chain, events = chain_with_events()
    (record,) = record_loop_calls(kt.Executor(chain), (32,))
    doc = kt.CacheEntry(
        record.op_id_v, record.call_key, {"reps": 16}, dev=record.device
    ).to_document()
    table = tmp_path / "table.json"
    from kerneltune._src.caching import shipped, storage

    storage.write_export_file(str(table), [doc], exported=0.0)
    chain.shipped = shipped.ShippedTables([table])
    (outcome,) = offline._tune_here([record], chain, False, False, None)
    assert outcome.status == "cached" and outcome.entry.cfg == LoopCfg(reps=16)
    assert count(events, "autotune_start") == 0
