"""Mosaic GPU candidates compile one at a time (jaxlib compiles them under one
process-wide lock), so a key whose candidates are mostly Mosaic GPU is tuned with
`compiles_at_once=1`: the search adds no configs to a batch for free
(`warm_start.WarmStart` pads a first batch no wider than the compile threads)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune._src.kernel import backends as backends_module
from kerneltune._src.kernel import hooks
from kerneltune._src.kernel.backends import Backend, BackendKernel
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.protocol import run_tuner
from kerneltune.kernels.ragged_dot.api import RaggedDot
from kerneltune.kernels.ragged_dot.config import RaggedDotConfig
from tests.helpers import CostInProgram, costed_sin, executor


@pytest.mark.parametrize(
    "backend, device, alone",
    [
        ("mosaic", "gpu", True),
        ("triton", "gpu", False),
        ("xla", "gpu", False),
        ("mosaic", "cpu", False),
    ],
)
def test_only_a_mosaic_gpu_config_on_a_gpu_compiles_one_at_a_time(
    monkeypatch, backend, device, alone
):
    monkeypatch.setattr(backends_module.devices, "device_kind", lambda: device)
    cfg = RaggedDotConfig(backend=backend)
    assert hooks.compiles_one_at_a_time(RaggedDot(), cfg) is alone


@pytest.mark.parametrize("at_once, workers", [(None, 6), (1, 1), (64, 6)])
def test_the_bench_reports_the_batch_that_costs_one_compile(at_once, workers):
    bench = kt.Tuner(max_workers=6)._bench(
        lambda cfg: None, None, [jnp.ones(4)], list(range(10)), 0,
        CostInProgram(), Progress("", False), compiles_at_once=at_once,
    )  # fmt: skip
    try:
        assert bench.workers == workers
    finally:
        bench.close()


def test_run_tuner_hands_compiles_at_once_to_a_tune_that_takes_it():
    seen = []

    class Recording(kt.Tuner):
        def tune(self, *args, compiles_at_once=None, **kw):
            seen.append(compiles_at_once)
            return super().tune(*args, compiles_at_once=compiles_at_once, **kw)

    report = run_tuner(
        Recording(timer=CostInProgram(), target_sample_s=5e-4), lambda fwd: costed_sin(fwd, 0),
        (jnp.ones(8),), {}, [3, 1, 2], reference_cfg=3, backward=False, name="t",
        compiles_at_once=1,
    )  # fmt: skip
    assert seen == [1] and report.best == 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cost:
    backend: str
    fwd: int


class Costed(Backend):
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, x, *, cfg):
        return costed_sin(cfg.fwd, 0)(x)


class Serial(Costed):
    name = "serial"


class Parallel(Costed):
    name = "parallel"


class TwoBackends(BackendKernel[Cost]):
    op_id = "compiles-at-once"
    config_type = Cost
    backends = (Serial(), Parallel())
    fallback = "parallel"

    def __init__(self, serial: int, parallel: int) -> None:
        super().__init__(interpret=True)
        self.counts = (serial, parallel)

    def heuristic_cfg(self, inv):
        return Cost(backend="parallel", fwd=9)

    def interpret_candidates(self, inv):
        serial, parallel = self.counts
        return [Cost(backend="serial", fwd=f) for f in range(1, serial + 1)] + [
            Cost(backend="parallel", fwd=f) for f in range(10, 10 + parallel)
        ]

    def reference(self, x):
        return jnp.sin(x)


@pytest.mark.parametrize("serial, parallel, at_once", [(3, 1, 1), (1, 3, None), (2, 2, None)])
def test_a_key_of_mostly_one_at_a_time_candidates_is_tuned_with_compiles_at_once_1(
    monkeypatch, serial, parallel, at_once
):
    monkeypatch.setattr(
        hooks, "compiles_one_at_a_time", lambda kernel, cfg: cfg.backend == "serial"
    )
    seen = []

    class Recording(kt.Tuner):
        def tune(self, *args, compiles_at_once=None, **kw):
            seen.append(compiles_at_once)
            return super().tune(*args, compiles_at_once=compiles_at_once, **kw)

    ex = executor(tuner=Recording(timer=CostInProgram(), iters=1, target_sample_s=5e-4))
    kernel = TwoBackends(serial, parallel)
    out = ex(kernel, jnp.linspace(0.0, 1.0, 16))
    assert jnp.allclose(out, jnp.sin(jnp.linspace(0.0, 1.0, 16)))
    assert seen == [at_once]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_tune_names_a_bad_compiles_at_once(bad):
    with pytest.raises(
        ValueError, match=r"compiles_at_once=\.\.\.\) must be an integer >= 1 or None, got"
    ):
        kt.Tuner(timer=CostInProgram()).tune(
            lambda fwd: costed_sin(fwd, 0), (jnp.ones(8),), {}, [1, 2], compiles_at_once=bad
        )
