"""Bad input gets a clear error naming the argument, the value and what is allowed."""

import dataclasses

import numpy as np
import pytest

import kerneltune as kt
from kerneltune._src.core import options
from tests.helpers import RepCfg, executor, rand


@dataclasses.dataclass(frozen=True)
class Other:
    x: int = 0


class Typed(kt.Kernel):
    op_id = "typed"

    def run(self, x, *, cfg):
        return x

    def heuristic_cfg(self, inv):
        return RepCfg(reps=1)

    def candidate_cfgs(self, inv):
        return [RepCfg(reps=1)]


def test_config_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"cfg for typed@v0 must be a RepCfg, got Other"):
        executor()(Typed(), rand((2,)), cfg=Other())


def test_candidate_of_the_wrong_type():
    class BadCandidates(Typed):
        def candidate_cfgs(self, inv):
            return [RepCfg(reps=1), Other()]

    with pytest.raises(TypeError, match=r"candidate #1 for typed@v0 must be a RepCfg"):
        executor()(BadCandidates(), rand((2,)))


def test_an_empty_candidate_list_uses_the_heuristic_even_in_production_mode():
    # Issue 13.1: a call with nothing to tune must not need a cache entry; the
    # heuristic is the only, deterministic choice.
    class Empty(Typed):
        def candidate_cfgs(self, inv):
            return []

    x = rand((2,))
    for fallback in ("autotune", "error"):
        chain = kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback=fallback)
        )
        why = kt.explain(Empty(), x, executor=kt.Executor(chain))
        assert why.tier == "heuristics" and why.cfg == Empty().heuristic_cfg(None)
        assert ("autotune", "Empty.candidate_cfgs returned no candidates for this call") in (
            why.misses
        )


def test_an_empty_candidate_list_without_a_heuristic_names_both_misses():
    class EmptyNoHeuristic(kt.Kernel):
        op_id = "empty_no_heuristic"

        def run(self, x, *, cfg):
            return x

        def candidate_cfgs(self, inv):
            return []

    with pytest.raises(RuntimeError, match=r"returned no candidates .*heuristics: the kernel"):
        executor()(EmptyNoHeuristic(), rand((2,)))


def test_a_heuristic_that_returns_none_is_named_not_called_missing():
    class NoneHeuristic(Typed):
        op_id = "none_heuristic"

        def heuristic_cfg(self, inv):
            return None

        def candidate_cfgs(self, inv):
            return []

    with pytest.raises(
        RuntimeError, match=r"heuristics: NoneHeuristic.heuristic_cfg returned None for this call"
    ):
        executor()(NoneHeuristic(), rand((2,)))


def test_kernel_with_no_run():
    class NoRun(kt.Kernel):
        op_id = "norun"

        def heuristic_cfg(self, inv):
            return RepCfg()

    with pytest.raises(TypeError, match=r"'norun' \(NoRun\) defines no run method"):
        executor(cache_miss_fallback="heuristics")(NoRun(), rand((2,)))


def test_unknown_environment_values(monkeypatch):
    for var, value, allowed in [
        ("KERNELTUNE_STAMP", "loud", "hash, json, none"),
        ("KERNELTUNE_AUTOTUNE", "maybe", "autotune, heuristics, error"),
        ("KERNELTUNE_PLATFORM", "cuda", "triton, pallas, xla"),
        ("KERNELTUNE_RECORD", "perhaps", "1, 0"),
    ]:
        monkeypatch.setenv(var, value)
        name = var.removeprefix("KERNELTUNE_").lower()
        with pytest.raises(ValueError) as info:
            options.get(name)
        assert (
            var in str(info.value) and repr(value) in str(info.value) and allowed in str(info.value)
        )
        monkeypatch.delenv(var)


def test_bad_policy_values():
    with pytest.raises(ValueError, match=r"cache_miss_fallback must be one of .*'never'"):
        kt.AutotunePolicy(cache_miss_fallback="never")
    with pytest.raises(TypeError, match=r"allow_autotune must be a bool, got 'yes'"):
        kt.AutotunePolicy(allow_autotune="yes")


def test_bad_kernel_names():
    with pytest.raises(ValueError, match="without '@'"):
        kt.Kernel("op@v2")
    with pytest.raises(ValueError, match="same thing"):
        kt.Kernel("a", name="b")
    assert kt.Kernel(name="mine").op_id == "mine"


def test_a_kernel_version_with_a_colon_is_refused_when_defined():
    # The version is part of every label stamped in the HLO, whose parts ':' separates.
    with pytest.raises(ValueError, match=r"Versioned.version must not contain ':', got '1:2'"):

        class Versioned(Typed):
            version = "1:2"


def test_bad_tuner_arguments():
    with pytest.raises(ValueError, match=r"warmup"):
        kt.Tuner(warmup=-1)
    with pytest.raises(ValueError, match=r"iters"):
        kt.Tuner(iters=0)


def test_scoped_options_override_environment(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_STAMP", "json")
    with options.scoped(stamp="none"):
        assert options.get("stamp") == "none"
    assert options.get("stamp") == "json"
    with pytest.raises(ValueError, match="allowed: hash, json, none"):
        with options.scoped(stamp="loud"):
            pass


def test_production_mode_runs_bundled_ops_that_have_nothing_to_tune_on_this_platform():
    # On CPU the bundled kernels have no candidates (XLA only): production mode uses
    # their heuristic instead of raising CacheMissError on every call.
    from kerneltune.kernels import layer_norm

    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="error")
    )
    x = rand((4, 16), seed=0)
    y = layer_norm(x, executor=kt.Executor(chain))
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)

    # A kernel with something to tune still refuses to tune; one whose only candidate
    # is its heuristic does not need to.
    class TwoCandidates(Typed):
        def candidate_cfgs(self, inv):
            return [RepCfg(reps=1), RepCfg(reps=2)]

    with pytest.raises(kt.CacheMissError):
        kt.Executor(chain)(TwoCandidates(), x)
    assert kt.explain(Typed(), x, executor=kt.Executor(chain)).misses[-1] == (
        "autotune",
        "the only candidate is the heuristic config",
    )
