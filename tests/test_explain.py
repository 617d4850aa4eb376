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
