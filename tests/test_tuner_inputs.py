"""Regression tests: measuring Pallas kernels, and tuning when handed tracers."""

import functools

import jax
import jax.numpy as jnp

import kerneltune as kt
from kerneltune.kernels.softmax.config import SoftmaxConfig
from kerneltune.kernels.softmax.pallas_triton import softmax_pallas
from tests.helpers import CostKernel, RepCfg, rand


def test_measure_times_a_pallas_kernel_that_builds_constants():
    # Compiling under ensure_compile_time_eval made the kernel body "capture constants".
    x = rand((8, 16))
    seconds = kt.Tuner().measure(
        lambda a: softmax_pallas(a, cfg=SoftmaxConfig(), interpret=True), x
    )
    assert seconds > 0


def test_measure_and_tune_inside_a_trace_use_random_inputs():
    seen = []

    def probe(a):
        return jnp.sin(a)

    def traced(a):
        seen.append(kt.Tuner().measure(probe, a))
        report = kt.Tuner().tune(
            lambda cfg: functools.partial(CostKernel().run, cfg=cfg), (a,), {}, [RepCfg(reps=1)]
        )
        seen.append(report.best)
        return a

    jax.jit(traced)(rand((4, 4)))
    assert seen[0] > 0 and seen[1] == RepCfg(reps=1)
