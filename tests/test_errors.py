"""Bad input gets a clear error naming the argument, the value and what is allowed."""

import dataclasses

import pytest
from helpers import RepCfg, rand

import kerneltune as kt
from kerneltune._src import options


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


def executor(**policy):
    return kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache(), policy=kt.AutotunePolicy(**policy)))


def test_config_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"cfg for typed@v0 must be a RepCfg, got Other"):
        executor()(Typed(), rand((2,)), cfg=Other())


def test_candidate_of_the_wrong_type():
    class BadCandidates(Typed):
        def candidate_cfgs(self, inv):
            return [RepCfg(reps=1), Other()]

    with pytest.raises(TypeError, match=r"candidate #1 for typed@v0 must be a RepCfg"):
        executor()(BadCandidates(), rand((2,)))


def test_empty_candidate_list():
    class Empty(Typed):
        def candidate_cfgs(self, inv):
            return []

    with pytest.raises(
        ValueError, match=r"Empty.candidate_cfgs returned no candidates for typed@v0"
    ):
        executor()(Empty(), rand((2,)))


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
