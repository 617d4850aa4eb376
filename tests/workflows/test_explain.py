"""explain(): which tier supplied the config, the key, candidates and why tiers missed."""

import jax
import pytest

import kerneltune as kt
from tests.helpers import CostKernel, RepCfg, executor, rand


def test_explain_a_tuned_call_lists_candidates_with_timings():
    ex = executor()
    x = rand((64, 64))
    first = kt.explain(CostKernel(), x, executor=ex)
    assert first.tier == "autotune" and first.cfg == first.report.best
    assert first.report is not None and len(first.report.candidates) == 3
    again = kt.explain(CostKernel(), x, executor=ex)
    assert again.tier == "memory"
    text = str(again)
    assert "cost@v0(f32[64,64])" in text and "the in-memory cache" in text
    assert text.count(" ms  RepCfg(") == 3  # every candidate with its time
    assert "overlay: no active overlay has this key" in text


def test_explain_override_and_heuristics():
    ex = executor(cache_miss_fallback="heuristics")
    assert (
        kt.explain(CostKernel(), rand((4, 4)), executor=ex, cfg=RepCfg(reps=2)).tier == "override"
    )
    why = kt.explain(CostKernel(), jax.ShapeDtypeStruct((4, 4), "float32"), executor=ex)
    assert why.tier == "heuristics" and why.cfg == RepCfg(reps=4)
    assert ("memory", "not in the memory cache") in why.misses


def test_explain_lists_every_tier_the_chain_asked_in_order():
    x = jax.ShapeDtypeStruct((4, 4), "float32")
    why = kt.explain(CostKernel(), x, executor=executor(cache_miss_fallback="heuristics"))
    assert [tier for tier, _ in why.misses] == ["override", "overlay", "memory", "persistent"]
    assert why.misses[-1] == ("persistent", "no persistent cache configured")


def test_production_mode_notes_why_the_heuristic_stood_in_for_tuning():
    class Untunable(CostKernel):
        op_id = "untunable"

        def candidate_cfgs(self, inv):
            return [RepCfg(reps=4)]  # only the heuristic: nothing to tune

    x = jax.ShapeDtypeStruct((4, 4), "float32")
    why = kt.explain(Untunable(), x, executor=executor(cache_miss_fallback="error"))
    assert why.tier == "heuristics" and why.cfg == RepCfg(reps=4)
    assert why.misses[-1][0] == "autotune" and why.misses[-1][1]
    with pytest.raises(kt.CacheMissError, match="cache_miss_fallback='error'"):
        kt.explain(CostKernel(), x, executor=executor(cache_miss_fallback="error"))


class _NeedsAPackage(CostKernel):
    """Configs with reps=16 need something this process lacks (as a backend tuned on a
    machine that has a package this one does not)."""

    op_id = "needs-a-package"

    def config_unusable(self, inv, cfg):
        return "the package is not installed" if cfg.reps == 16 else None


def test_a_stored_config_that_cannot_run_here_is_a_miss_and_an_override_an_error(tmp_path):
    x = jax.ShapeDtypeStruct((4, 4), "float32")
    kernel = _NeedsAPackage()
    store = kt.PersistentCache(str(tmp_path))
    ex = executor(persistent=store, cache_miss_fallback="heuristics")
    key = ex.invocation(kernel, x)
    store.put(kt.device_fingerprint(), kernel.op_id_v, key.call_key, RepCfg(reps=16))
    why = kt.explain(kernel, x, executor=ex)
    assert why.tier == "heuristics" and why.cfg == RepCfg(reps=4)
    (reason,) = [r for tier, r in why.misses if tier == "persistent"]
    assert "cannot run here: the package is not installed" in reason
    # A config it can run is used as stored.
    store.put(kt.device_fingerprint(), kernel.op_id_v, key.call_key, RepCfg(reps=1))
    assert kt.explain(kernel, x, executor=executor(persistent=store)).tier == "persistent"
    with pytest.raises(ValueError, match=r"cfg=RepCfg\(reps=16\) cannot run needs-a-package"):
        kt.explain(kernel, x, executor=ex, cfg=RepCfg(reps=16))
    # So is an entered AutotuningResult's (an overlay) made where the package was.
    result = kt.AutotuningResult(
        kt.device_fingerprint(), (kt.Entry(kernel.op_id_v, key.call_key, RepCfg(reps=16)),)
    )
    with result:
        why = kt.explain(kernel, x, executor=executor(cache_miss_fallback="heuristics"))
    assert why.tier == "heuristics"
    assert any(t == "overlay" and "cannot run here" in r for t, r in why.misses)


def test_stored_timings_mark_the_winner_stored_under_old_field_names():
    # A matmul entry stored before `bm`/`bn`/`bk` became `block_m`/`block_n`/`block_k`:
    # the winner it loads as is still the candidate marked "*".
    from kerneltune._src.core.configs import config_to_dict
    from kerneltune._src.workflows.explain import stored_timings
    from kerneltune.kernels.matmul.config import MatmulConfig

    win = MatmulConfig(backend="triton", block_m=64)
    before = {"block_m": "bm", "block_n": "bn", "block_k": "bk"}
    old = {before.get(k, k): v for k, v in config_to_dict(win).items()}
    other = {**old, "bm": 128}
    entry = kt.CacheEntry(
        "matmul@v3",
        "key",
        win,
        timings=[
            {"cfg": other, "status": "ok", "time_s": 2e-3},
            {"cfg": old, "status": "ok", "time_s": 1e-3},
        ],
    )
    lines = stored_timings(entry)
    marked = [line for line in lines[1:] if line.lstrip().startswith("*")]
    assert len(marked) == 1 and "bm=64" in marked[0] and "1.0000 ms" in marked[0]


def test_candidates_the_search_did_not_try_are_not_shown_with_a_none_error():
    # Before: "pruned: None  RepCfg(reps=12)" for each candidate a search passed over.
    from tests.helpers import cost_tuner

    class Wide(CostKernel):
        op_id = "explain_wide"

        def candidate_cfgs(self, inv):
            return [RepCfg(reps=r) for r in range(1, 21)]

    tuner = cost_tuner(progress=False, strategy="coordinate", max_evals=4)
    why = kt.explain(Wide(), rand((8, 8)), executor=executor(tuner=tuner))
    text = str(why)
    assert "None" not in text, text
    untried = [c for c in why.report.candidates if c.status == "pruned"]
    assert untried and text.count("pruned: not tried by the search") == len(untried), text
