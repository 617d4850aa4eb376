"""`kt.autotune(f, *args, **kwargs)`: tuning every kerneltune call of a whole function
(issue 13), through the default executor as a user would call it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune._src.kernel.backends import Backend, BackendKernel
from tests.helpers import CostInProgram, rand
from tests.offline_kernels import CHEAPEST, LoopKernel, SinKernel

pytestmark = pytest.mark.usefixtures("empty_registry")


class CountingTuner(kt.Tuner):
    """The deterministic tuner, counting the keys it benchmarks."""

    def __init__(self):
        super().__init__(target_sample_s=5e-4, timer=CostInProgram(), progress=False)
        self.tuned = []

    def tune(self, make_fn, args, kwargs, candidates, **kw):
        self.tuned.append(kw.get("name", ""))
        return super().tune(make_fn, args, kwargs, candidates, **kw)


class WholeSin(SinKernel):
    op_id = "whole_fn_sin"


def test_a_whole_function_has_its_forward_and_backward_calls_tuned_once_each():
    sin, loop = WholeSin(), LoopKernel("whole_fn_loop")

    def loss(x, *, alpha):
        return jnp.sum(sin(loop(x, alpha=alpha)) ** 2)

    step = jax.value_and_grad(loss)
    x = rand((64, 64), seed=0)
    tuner = CountingTuner()
    # Shapes are enough: tuning runs on random data of these shapes and dtypes.
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    result = kt.autotune(step, spec, alpha=0.5, tuner=tuner)
    assert sorted(e.op_id_v for e in result) == [
        "sin_bwd@v0",
        "whole_fn_loop@v0",
        "whole_fn_sin@v0",
    ]
    assert all(e.cfg == CHEAPEST for e in result)
    # Each key once (nothing while tracing), then the function with the tuned configs
    # against the function with the heuristic ones.
    assert len(tuner.tuned) == 4 and tuner.tuned[3] == "the whole function"
    # The default executor now serves the tuned configs, eagerly and under jit.
    why = kt.explain(loop, x, alpha=0.5)
    assert why.tier == "memory" and why.cfg == CHEAPEST
    value, grad = jax.jit(step, static_argnames="alpha")(x, alpha=0.5)
    y = jnp.sin(x * 0.5)
    np.testing.assert_allclose(value, jnp.sum(y**2), rtol=1e-5)
    np.testing.assert_allclose(grad, 2 * y * jnp.cos(x * 0.5) * 0.5, rtol=1e-4, atol=1e-5)
    assert len(tuner.tuned) == 4
    # Again: everything is cached, nothing is benchmarked.
    again = kt.autotune(step, x, alpha=0.5, tuner=tuner)
    assert len(again) == 3 and len(tuner.tuned) == 4


class OneCandidateSin(SinKernel):
    """Its only candidate is its heuristic config: nothing to tune (as attention under
    a gradient where cuDNN alone can run the call)."""

    op_id = "whole_fn_one_candidate"

    def candidate_cfgs(self, inv):
        return [self.heuristic_cfg(inv)]


def test_a_call_with_nothing_to_tune_is_listed_with_why(tmp_path):
    # `kt.autotune(step)` on a GPU left the step's attention out of its result when
    # cuDNN was its one candidate: a reader could not see every kernel call of the step.
    one, loop = OneCandidateSin(), LoopKernel("whole_fn_loop_listed")

    def loss(x):
        return jnp.sum(one(loop(x, alpha=0.5)))

    x = jax.ShapeDtypeStruct((32, 32), jnp.float32)
    result = kt.autotune(jax.value_and_grad(loss), x, tuner=CountingTuner())
    by_op = {e.op_id_v: e for e in result}
    assert set(by_op) == {"whole_fn_one_candidate@v0", "whole_fn_loop_listed@v0", "sin_bwd@v0"}
    listed = by_op["whole_fn_one_candidate@v0"]
    assert listed.untuned and listed.cfg == OneCandidateSin().heuristic_cfg(None)
    assert listed.strategy == "untuned: the only candidate is the heuristic config"
    assert not by_op["whole_fn_loop_listed@v0"].untuned
    # A listing is not a tuned config: importing the result into a cache skips it, so a
    # later install that brings more candidates still tunes the call.
    path = tmp_path / "result.json"
    result.save(path)
    loaded = kt.AutotuningResult.load(path)
    assert [(e.op_id_v, e.strategy) for e in loaded] == [(e.op_id_v, e.strategy) for e in result]
    cache = kt.PersistentCache(str(tmp_path / "cache"))
    assert cache.import_(path) == len(result) - 1
    assert {e.op_id for e in cache.entries()} == {"whole_fn_loop_listed@v0", "sin_bwd@v0"}


def test_a_step_jitted_and_run_before_uses_the_configs_after_one_retrace():
    loop = LoopKernel("whole_fn_retrace")
    traces = []

    @jax.jit
    def step(x):
        traces.append(1)
        return loop(x, alpha=2.0).sum()

    x = rand((32, 32), seed=1)
    with kt.policy_override(autotune=False):
        step(x)  # the heuristic, as a job that has not tuned yet
        assert kt.explain(loop, x, alpha=2.0).tier == "heuristics"
    kt.autotune(step, x, tuner=CountingTuner())
    n = len(traces)
    np.testing.assert_allclose(step(x), 2.0 * x.sum(), rtol=1e-5)
    step(x)
    assert len(traces) == n + 1  # traced once more, with the tuned config, and only once


def test_autotune_names_what_it_cannot_take():
    with pytest.raises(TypeError, match="Kernel instance or a function, got int"):
        kt.autotune(42)
    with pytest.raises(TypeError, match="configs= applies to a Kernel"):
        kt.autotune(lambda x: x, jnp.ones(2), configs=[1])


class FusionAwareCost:
    """A deterministic timer: a program costs its largest `ktcost_N`; inside a whole
    function (a `ktwhole` scope) each `ktlost_N` adds N, the cost of a fusion that a
    config prevents (which no kernel timed alone can show)."""

    name = "fusion-aware-cost"

    def sample(self, fn, arg_sets, calls, start):
        import re

        jax.block_until_ready(fn(*arg_sets[start % len(arg_sets)]))
        text = fn.as_text()
        cost = max([int(c) for c in re.findall(r"ktcost_(\d+)", text)] or [1])
        if "ktwhole" in text:
            cost += sum(int(c) for c in set(re.findall(r"ktlost_(\d+)", text)))
        return cost * 1e-6


@dataclasses.dataclass(frozen=True)
class FusedCfg:
    cost: int
    lost: int = 0


class Fusable(kt.Kernel):
    """`x + 1`; config B is faster alone but costs a fusion inside a model."""

    op_id = "fusable"

    def __init__(self, lost):
        super().__init__(f"fusable_{lost}")
        self.lost = lost

    def run(self, x, *, cfg):
        with jax.named_scope(f"ktcost_{cfg.cost}"), jax.named_scope(f"ktlost_{cfg.lost}"):
            return x + 1.0

    def heuristic_cfg(self, inv):
        return FusedCfg(cost=100)

    def candidate_cfgs(self, inv):
        return [FusedCfg(cost=100), FusedCfg(cost=50, lost=self.lost)]


@pytest.mark.parametrize("lost, kept", [(300, FusedCfg(cost=100)), (10, FusedCfg(50, 10))])
def test_tuned_configs_are_kept_only_when_the_whole_function_is_faster(lost, kept):
    kernel = Fusable(lost)

    def model(x):
        with jax.named_scope("ktwhole"):
            return (kernel(x) * 2.0).sum()

    tuner = kt.Tuner(timer=FusionAwareCost(), target_sample_s=5e-4, progress=False)
    x = jnp.ones((8, 8))
    (entry,) = kt.autotune(model, x, tuner=tuner)
    assert entry.cfg == kept
    # The default executor serves the decision from now on.
    assert kt.explain(kernel, x).cfg == kept


def test_the_whole_function_decision_is_agreed_between_processes(monkeypatch):
    # In a job, one process may measure the tuned configs faster and another not; they
    # must keep the same configs (one program). Here the local measurement says "keep
    # the heuristic" (a 299 fusion cost) but the agreed winner is the tuned variant.
    from kerneltune._src.tuning import distributed
    from kerneltune._src.workflows import tune_function

    seen = []

    def agree(key, report, **kw):
        seen.append(key)
        tuned = next(c.cfg for c in report.candidates if c.cfg != report.heuristic_cfg)
        return dataclasses.replace(report, best=tuned)

    monkeypatch.setattr(distributed, "agree", agree)
    kernel = Fusable(299)  # an op id of its own: nothing cached by the tests above

    def model(x):
        with jax.named_scope("ktwhole"):
            return (kernel(x) * 2.0).sum()

    tuner = kt.Tuner(timer=FusionAwareCost(), target_sample_s=5e-4, progress=False)
    (entry,) = kt.autotune(model, jnp.ones((8, 8)), tuner=tuner)
    assert entry.cfg == FusedCfg(50, 299)  # the agreed choice, not the local one
    (whole,) = [k for k in seen if k[1] == tune_function.WHOLE_FUNCTION_OP]
    assert len(whole[2]) > 8  # keyed by the tuned calls, the same in every process


@dataclasses.dataclass(frozen=True)
class BackendCost:
    backend: str
    cost: int


class _Pallas(Backend):
    """Stands for a Pallas kernel on the device (a custom call XLA fuses nothing into);
    its code is plain JAX so that it runs here."""

    name = "pallas"
    lowering = "mosaic_gpu"
    differentiated_by_jax = True

    def run(self, kernel, x, *, cfg):
        with jax.named_scope(f"ktcost_{cfg.cost}"):
            return x + 1.0


class _Xla(_Pallas):
    name = "xla"
    lowering = None
    plain_jax = True


class PallasOrXla(BackendKernel[BackendCost]):
    op_id = "pallas_or_xla"
    config_type = BackendCost
    backends = (_Pallas(), _Xla())

    def __init__(self, tuned_backend):
        super().__init__(f"pallas_or_xla_{tuned_backend}")
        self.tuned_backend = tuned_backend

    def heuristic_cfg(self, inv):
        return BackendCost("pallas", 100)

    def search_space(self, inv):
        return [BackendCost("pallas", 100), BackendCost(self.tuned_backend, 50)], []


@pytest.mark.parametrize("tuned_backend, timed_whole", [("pallas", False), ("xla", True)])
def test_the_whole_function_is_timed_only_when_a_change_involves_xla_code(
    monkeypatch, tuned_backend, timed_whole
):
    # From one Pallas kernel to another, the kernel's time alone is its time in the
    # function (no fusion): the function is not compiled and timed twice more.
    monkeypatch.setattr(BackendKernel, "use_interpreter", lambda self: False)
    monkeypatch.setattr(BackendKernel, "runs_pallas", lambda self: True)
    kernel = PallasOrXla(tuned_backend)
    tuner = CountingTuner()
    (entry,) = kt.autotune(lambda x: kernel(x).sum(), jnp.ones((8, 8)), tuner=tuner)
    assert entry.cfg == BackendCost(tuned_backend, 50)
    assert ("the whole function" in tuner.tuned) is timed_whole
    assert len(tuner.tuned) == 1 + timed_whole
