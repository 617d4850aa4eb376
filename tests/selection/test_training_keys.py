"""A training key whose candidates partly share one backward (a Pallas grouped
matmul's d_lhs/d_rhs kernels, tuned at their own keys) times those candidates forward
only and their backward once (`selection/training_keys.py`); the winner and the
reported forward + backward times are those of timing every candidate whole."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune._src.kernel.backends import Backend, BackendKernel
from kerneltune._src.selection import training_keys
from kerneltune._src.tuning.report import CandidateResult, TuningReport
from tests.helpers import CostInProgram, costed_sin, executor

#: What the shared backward costs, whatever the forward config.
SHARED_BACKWARD = 10


class SumOfCosts(CostInProgram):
    """The cost timer, adding the program's distinct `ktcost_N` scopes (forward and
    backward both count) instead of taking the largest (costs here never repeat)."""

    def sample(self, fn, arg_sets, calls, start):
        jax.block_until_ready(fn(*arg_sets[start % len(arg_sets)]))
        return sum({int(c) for c in re.findall(r"ktcost_(\d+)", fn.as_text())}) * 1e-6 or 1e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class Costs:
    backend: str
    fwd: int
    bwd: int = 0  # the own backend's backward; the shared one ignores it


class SharedBackward(Backend):
    """A forward of cost `fwd` whose backward is the same whatever the config, as a
    Pallas grouped matmul's is."""

    name = "shared"
    backward_tuned_apart = True
    traced_backwards = 0  # how many times a backward was traced (each one lowered)

    def run(self, kernel, x, *, cfg):
        with jax.named_scope(f"ktcost_{cfg.fwd}"):
            return jnp.sin(x) * 1.0

    def fwd_with_residuals(self, kernel, x, *, cfg):
        return self.run(kernel, x, cfg=cfg), None

    def vjp(self, kernel, residuals, out, dout, x, *, cfg):
        type(self).traced_backwards += 1
        with jax.named_scope(f"ktcost_{SHARED_BACKWARD}"):
            return (jnp.cos(x) * dout,)


class OwnBackward(Backend):
    """A backend JAX differentiates: its backward comes with its config, as XLA's or
    tokamax's does."""

    name = "own"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, x, *, cfg):
        return costed_sin(cfg.fwd, cfg.bwd)(x)


class Mixed(BackendKernel[Costs]):
    op_id = "mixed-backward"
    config_type = Costs
    tunes_training_apart = True
    backends = (SharedBackward(), OwnBackward())
    fallback = "own"
    own_cfg = Costs(backend="own", fwd=2, bwd=6)  # 8 in all

    def heuristic_cfg(self, inv):
        return Costs(backend="shared", fwd=5)  # 15 in all

    def interpret_candidates(self, inv):
        return [Costs(backend="shared", fwd=f) for f in (1, 3, 7)] + [self.own_cfg]

    def reference(self, x):
        return jnp.sin(x)


def _tune_a_training_step(kernel):
    events = []
    ex = executor(events=events, tuner=kt.Tuner(timer=SumOfCosts(), iters=1, target_sample_s=5e-4))
    x = jnp.linspace(0.0, 1.0, 64)
    grad = jax.grad(lambda x: ex(kernel, x).sum())(x)
    assert jnp.allclose(grad, jnp.cos(x), atol=1e-6)
    (report,) = [d["report"] for e, d in events if e == "autotune_finish"]
    return report


@pytest.fixture
def counted():
    SharedBackward.traced_backwards = 0
    return SharedBackward


def test_the_shared_backward_is_lowered_once_and_times_mean_forward_plus_backward(counted):
    report = _tune_a_training_step(Mixed(interpret=True))
    # The own candidate (2 + 6) beats the fastest shared one (1 + 10).
    assert report.best == Mixed.own_cfg
    times = {c.cfg.fwd if c.cfg.backend == "shared" else "own": c.time_s for c in report.candidates}
    assert times == pytest.approx({5: 15e-6, 1: 11e-6, 3: 13e-6, 7: 17e-6, "own": 8e-6}, rel=1e-6)
    assert report.heuristic_time_s == pytest.approx(15e-6)
    # One shared candidate traced its backward (the fastest); before, all four did.
    assert counted.traced_backwards == 1
    assert "forward only for the 4 candidates" in report.strategy


class SharedWins(Mixed):
    op_id = "mixed-backward-shared-wins"
    own_cfg = Costs(backend="own", fwd=2, bwd=12)  # 14: the shared fwd=1 (11) wins


def test_a_shared_candidate_wins_on_its_forward_plus_the_backward(counted):
    report = _tune_a_training_step(SharedWins(interpret=True))
    assert report.best == Costs(backend="shared", fwd=1)
    assert report.best_time_s == pytest.approx(11e-6)
    assert report.speedup == pytest.approx(15 / 11)


def _result(cfg, t):
    return CandidateResult(cfg=cfg, time_s=t, samples_s=(t,))


def _report(best, *results, strategy="exhaustive"):
    return TuningReport(best=best, candidates=tuple(results), timer="t", strategy=strategy)


def test_fewer_than_two_shared_candidates_or_a_failing_fastest_leave_one_stage():
    calls = []

    def tune(cands, **kw):
        calls.append((list(cands), kw["backward"]))
        if kw["backward"]:  # the fastest shared one fails with its backward
            return _report(None, CandidateResult(cfg=cands[0], status="compile_error"))
        return _report(cands[0], *(_result(c, 1.0) for c in cands))

    apart = lambda c: c.startswith("s")  # noqa: E731
    assert (
        training_keys.tune_in_two(tune, ["s1", "o1"], apart=apart, heuristic="s1", hints=[]) is None
    )
    assert calls == []
    got = training_keys.tune_in_two(tune, ["s1", "s2", "o1"], apart=apart, heuristic="s1", hints=[])
    assert got is None  # the caller times every candidate with its backward
    assert calls == [(["s1", "s2"], False), (["s1", "o1"], True)]


def test_hints_go_to_the_stage_of_their_candidates():
    seen = {}

    def tune(cands, **kw):
        seen[kw["backward"]] = (kw["hints"], kw["reference_cfg"])
        return _report(cands[0], *(_result(c, 1.0 + i) for i, c in enumerate(cands)))

    apart = lambda c: c.startswith("s")  # noqa: E731
    training_keys.tune_in_two(
        tune, ["o1", "s1", "s2"], apart=apart, heuristic="o1", hints=["s2", "o1"]
    )
    assert seen == {False: (["s2"], None), True: (["o1"], "o1")}


def test_with_hints_only_the_hinted_own_backward_candidates_are_timed():
    # A warm search reaches an own-backward candidate only as the heuristic or a hint:
    # timing all of them (XLA's dense ragged_dot with its backward) cost 12-18 s a key.
    timed = {}

    def tune(cands, **kw):
        timed[kw["backward"]] = list(cands)
        return _report(cands[0], *(_result(c, 1.0 + i) for i, c in enumerate(cands)))

    apart = lambda c: c.startswith("s")  # noqa: E731
    cands = ["s1", "o1", "s2", "o2", "o3"]
    got = training_keys.tune_in_two(tune, cands, apart=apart, heuristic="s1", hints=["o2", "s2"])
    assert timed[True] == ["s1", "o2"]
    status = {c.cfg: c.status for c in got.candidates}
    assert [c.cfg for c in got.candidates] == cands
    assert status == {"s1": "ok", "s2": "ok", "o2": "ok", "o1": "pruned", "o3": "pruned"}
    training_keys.tune_in_two(tune, cands, apart=apart, heuristic="s1", hints=[])
    assert timed[True] == ["s1", "o1", "o2", "o3"]  # no hints: the whole space


def test_with_no_own_backward_candidate_in_reach_the_second_stage_is_not_run():
    # It would time the fastest shared candidate against nothing: on an MoE layer it
    # cost each forward key a reference compile, inputs and first runs.
    stages = []

    def tune(cands, **kw):
        stages.append(kw["backward"])
        return _report(cands[1], *(_result(c, 2.0 - i) for i, c in enumerate(cands)))

    apart = lambda c: c.startswith("s")  # noqa: E731
    cands = ["o1", "s1", "s2", "o2"]
    got = training_keys.tune_in_two(tune, cands, apart=apart, heuristic="s1", hints=["s2"])
    assert stages == [False]
    assert got.best == "s2" and got.best_time_s == 1.0  # forward only, as timed
    assert [c.cfg for c in got.candidates] == cands
    assert {c.cfg: c.status for c in got.candidates} == {
        "o1": "pruned", "s1": "ok", "s2": "ok", "o2": "pruned",
    }  # fmt: skip
    assert "forward only: every candidate in reach shares one backward" in got.strategy


class SharedOnly(Mixed):
    op_id = "mixed-backward-shared-only"

    def interpret_candidates(self, inv):
        return [Costs(backend="shared", fwd=f) for f in (1, 3, 7)]


def test_a_key_whose_candidates_all_share_the_backward_traces_it_only_for_the_step(counted):
    report = _tune_a_training_step(SharedOnly(interpret=True))
    assert report.best == Costs(backend="shared", fwd=1)
    assert report.best_time_s == pytest.approx(1e-6)  # its forward alone
    assert report.speedup == pytest.approx(5.0)
    assert "not timed here" in report.strategy
    assert counted.traced_backwards == 1  # the step's own backward; no second stage
