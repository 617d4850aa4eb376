"""The public `benchmark` and `autotune(kernel, ...)` functions."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from kerneltune._src.kernel.base import Kernel
from kerneltune._src.tuning.tuner import Tuner
from kerneltune._src.workflows.benchmarking import autotune, benchmark


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChainCfg:
    reps: int


class Chain(Kernel):
    """`reps` chained products whose result does not depend on `reps`; `reps=0` is a
    config this kernel refuses, `reps=-1` a wrong one."""

    op_id = "chain"

    def run(self, x, *, cfg, scale=1.0):
        if cfg.reps == 0:
            raise ValueError("reps must be positive")
        if cfg.reps < 0:
            return x @ x * (scale + 0.5)
        out = x @ x
        y = out
        for _ in range(cfg.reps - 1):
            y = jnp.tanh(y @ x)
        return (out + y * 0.0) * scale

    def heuristic_cfg(self, inv):
        return ChainCfg(reps=4)

    def candidate_cfgs(self, inv):
        return [ChainCfg(reps=r) for r in (8, 0, -1, 1, 4)]


class NoSpace(Kernel):
    op_id = "nospace"

    def run(self, x, *, cfg):
        return x

    def heuristic_cfg(self, inv):
        return ChainCfg(reps=1)


def data(n=96):
    return jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)


def test_benchmark_returns_milliseconds(monkeypatch):
    x = data()
    assert 0 < benchmark(lambda a: a @ a, x, num_warmup=1, num_iters=3) < 100  # a real run
    # The unit, without the wall clock of a loaded machine (two timings of a 26 us
    # product differed 37x there once): the tuner's seconds come back as milliseconds.
    monkeypatch.setattr(Tuner, "measure", lambda self, fn, *a, **kw: 0.0025)
    assert benchmark(lambda a: a @ a, x) == pytest.approx(2.5)


def test_benchmark_warns_when_fn_closes_over_arrays(recwarn):
    # README once showed `benchmark(lambda: op(x))`: x became a compile-time constant
    # and the time was 30x too low. The warning says how to pass it instead.
    x = data(32)
    with pytest.warns(
        UserWarning, match=r"closes over 1 array\(s\) \(float32\[32, 32\]\).*benchmark\(fn, x\)"
    ):
        benchmark(lambda: x @ x, num_iters=2)
    recwarn.clear()
    benchmark(lambda a: a @ a, x, num_iters=2)
    benchmark(Chain(), x, num_iters=2)
    assert not [w for w in recwarn if "closes over" in str(w.message)]


def test_benchmark_of_something_not_callable_names_the_argument():
    # Before: "'int' object is not callable" from inside the tuner's trace.
    with pytest.raises(
        TypeError, match=r"benchmark\(fn, \.\.\.\) needs a function .* got int \(3\)"
    ):
        benchmark(3, data(8))


def test_benchmark_passes_keyword_arguments_and_statics():
    x = data()
    assert benchmark(lambda a, *, n: a * n, x, n=3, num_iters=2) > 0


class Priced(Chain):
    def run(self, x, *, cfg, scale=1.0):
        with jax.named_scope(f"ktcost_{cfg.reps}"):  # what CostInProgram reads
            return super().run(x, cfg=cfg, scale=scale)


def deterministic():
    """A tuner whose timer reads each config's cost from its program: winners cannot
    depend on the machine's load."""
    from tests.helpers import CostInProgram

    return Tuner(strategy="exhaustive", iters=2, progress=False, timer=CostInProgram())


def test_autotune_uses_the_kernels_space_and_rejects_bad_candidates():
    assert autotune(Priced(), data(), tuner=deterministic()) == ChainCfg(reps=1)


def test_autotune_with_explicit_configs_and_kwargs():
    configs = [ChainCfg(reps=6), ChainCfg(reps=2)]
    assert autotune(Priced(), data(), configs=configs, scale=2.0, tuner=deterministic()) == (
        ChainCfg(reps=2)
    )


def test_autotune_with_the_default_tuner_times_with_its_samples_and_picks_the_cheapest(
    monkeypatch,
):
    # The default tuner (built from num_warmup/num_iters) with its "auto" timer swapped
    # for the deterministic one: CI once saw the wall clock of a loaded 2-core machine
    # pick a chain of 40 products over 1.
    from kerneltune._src.tuning import timing
    from tests.helpers import CostInProgram

    chosen = []

    def choose(preference="auto"):
        chosen.append(preference)
        return CostInProgram(), None

    monkeypatch.setattr(timing, "choose_timer", choose)
    made = []
    real_init = Tuner.__init__

    def spy(self, *a, **kw):
        made.append(kw)
        real_init(self, *a, **kw)

    monkeypatch.setattr(Tuner, "__init__", spy)
    configs = [ChainCfg(reps=40), ChainCfg(reps=1)]
    assert autotune(Priced(), data(), configs=configs, num_warmup=2, num_iters=3) == ChainCfg(
        reps=1
    )
    assert made == [{"warmup": 2, "iters": 3}]
    assert chosen == ["auto"]


def test_autotune_raises_when_every_candidate_fails():
    with pytest.raises(ExceptionGroup, match="candidates failed") as info:
        autotune(Chain(), data(), configs=[ChainCfg(reps=0), ChainCfg(reps=-1)])
    assert any("reps must be positive" in str(e) for e in info.value.exceptions)


def test_autotune_argument_errors():
    with pytest.raises(TypeError, match="Kernel instance or a function"):
        autotune("matmul", data())
    with pytest.raises(TypeError, match="candidate_cfgs/config_space"):
        autotune(NoSpace(), data())
    with pytest.raises(ValueError, match="no candidate"):
        autotune(Chain(), data(), configs=[])
    with pytest.raises(RuntimeError, match="no candidate"):  # as the original raised
        autotune(Chain(), data(), configs=[])
    with pytest.raises(TypeError, match="ChainCfg"):
        autotune(Chain(), data(), configs=[{"reps": 1}])


def test_a_candidate_moves_only_along_its_transitions_and_its_first_failure_stands():
    from kerneltune._src.tuning.candidate import Candidate, Phase

    c = Candidate(0, "cfg")
    assert (c.status, c.submitted, c.ran) == (None, False, False)
    c.submit()
    c.compiled_as("program")
    assert c.status == "ok" and not c.ran
    with pytest.raises(RuntimeError, match="cannot go from compiled to dropped"):
        c.drop()
    c.ran_once(1e-3)
    c.drop()
    assert c.dropped and c.ok
    c.resume()
    assert c.phase is Phase.TIMED
    c.fail("run_error", "boom")
    c.fail("invalid", "later")
    assert (c.status, c.error, c.compiled, c.ran) == ("run_error", "boom", None, False)
    c.resume()  # a failed candidate stays failed
    assert c.phase is Phase.FAILED and c.result().status == "run_error"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: benchmark(jnp.sin, data(8), num_iters=0), r"benchmark\(num_iters=...\).* 0"),
        (lambda: benchmark(jnp.sin, data(8), num_warmup=-1), r"benchmark\(num_warmup=...\).* -1"),
        (
            lambda: autotune(Chain(), data(8), configs=[ChainCfg(reps=1)], num_iters=0),
            r"autotune\(num_iters=...\).* 0",
        ),
        (
            lambda: autotune(Chain(), data(8), configs=[ChainCfg(reps=1)], num_warmup=2.5),
            r"autotune\(num_warmup=...\).* 2.5",
        ),
    ],
)
def test_sample_counts_out_of_range_are_named_as_the_caller_spelt_them(call, message):
    # They were reported as `Tuner(iters=...)`/`Tuner(warmup=...)`, arguments the
    # caller of benchmark/autotune never wrote.
    with pytest.raises(ValueError, match=message):
        call()
