"""The tuner benchmark's diagnostics, each in a fresh process: versions and what one
CUPTI session costs, how compiling many candidates scales, and tuning after the JAX
profiler ran (it must fall back to the wall clock, not abort)."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.tuner_space import SHAPES, TINY_SHAPES, MatmulCfg, inputs, matmul, space


def work_diag(tiny):
    """Versions, the CUPTI API's signature, and what one `measure` session costs."""
    import inspect

    import jax
    import jax.numpy as jnp
    import jaxlib

    out = {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "devices": [str(d) for d in jax.devices()],
    }
    out["device_kind"] = jax.devices()[0].device_kind
    out["cpu_count"] = os.cpu_count()
    if tiny:
        out["compile_scaling"] = compile_scaling(tiny=True)
        return out
    from jax.experimental.mosaic.gpu import profiler

    out["measure_signature"] = str(inspect.signature(profiler.measure))
    cupti_cls = getattr(profiler, "Cupti", None)
    out["Cupti_fields"] = [f.name for f in dataclasses.fields(cupti_cls)] if cupti_cls else None
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        out["nvidia_smi"] = smi.stdout.strip()
    except Exception as e:
        out["nvidia_smi"] = repr(e)
    x = jnp.ones((4096, 4096), jnp.bfloat16)
    fn = jax.jit(lambda v: v @ v).lower(x).compile()
    costs = {}

    def session_costs(label, make):
        walls, device = [], None
        try:
            for _ in range(5):
                t0 = time.perf_counter()
                _, device = make()(x)
                walls.append(time.perf_counter() - t0)
            costs[label] = {"wall_s": [round(w, 5) for w in walls], "device_ms": repr(device)[:200]}
        except Exception as e:
            costs[label] = {"error": f"{type(e).__name__}: {e}"[:300]}

    session_costs("measure(iterations=1)", lambda: profiler.measure(fn, iterations=1))
    session_costs("measure(iterations=10)", lambda: profiler.measure(fn, iterations=10))
    if cupti_cls is not None:
        session_costs(
            "Cupti(finalize=False)(iterations=1)",
            lambda: cupti_cls(finalize=False).measure(fn, iterations=1),
        )
        session_costs(
            "Cupti(finalize=True) after", lambda: cupti_cls(finalize=True).measure(fn, iterations=1)
        )
    t0 = time.perf_counter()
    for _ in range(10):
        jax.block_until_ready(fn(x))
    costs["plain_call_wall_s"] = (time.perf_counter() - t0) / 10
    out["measure_costs"] = costs
    out["compile_scaling"] = compile_scaling()
    return out


def compile_scaling(tiny=False):
    """How to compile many candidates: half the space (even positions) on 16 threads
    that each lower (taking turns at the tracer) and compile, the other half (odd
    positions: different configs, so no cache can help) through kerneltune's pool (one
    lowering thread feeding 16 compile threads, largest configs first); and, one
    candidate at a time, how long lowering (Python, holds the GIL) and compiling (C++,
    releases it) take."""

    from kerneltune._src.tuning import compile_cost, config_space, programs
    from kerneltune._src.tuning.compiling import CompilePool

    a, b = inputs(TINY_SHAPES[0] if tiny else SHAPES[0], tiny)
    cands = space(tiny)

    def lower(cfg):
        # Taking turns at JAX's tracer: two threads lowering Pallas kernels at once
        # crash the process (a segmentation fault in CI), so no arm may do it.
        return programs.lower_alone(matmul(cfg, interpret=tiny), (a, b))

    def compile_(lowered):
        return lowered.compile()

    def build(cfg):
        try:
            compile_(lower(cfg))
        except Exception:
            pass

    out = {}
    part = cands[0::2]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(build, part))
    out[f"{len(part)} candidates, 16 threads lowering and compiling"] = round(
        time.perf_counter() - t0, 2
    )
    part = cands[1::2]
    t0 = time.perf_counter()
    pool = CompilePool(16, None)
    for i, cfg in enumerate(part):
        prior = compile_cost.prior_size(config_space.config_point(cfg))
        pool.submit(i, functools.partial(lower, cfg), compile_, priority=-prior)
    while pool.pending:
        pool.poll(0.05)
    pool.close()
    out[f"{len(part)} candidates, 1 lowering thread feeding 16 compile threads"] = round(
        time.perf_counter() - t0, 2
    )
    split = []
    for cfg in space(tiny)[-6:] + space(tiny)[:2]:
        try:
            t0 = time.perf_counter()
            lowered = lower(cfg)
            t1 = time.perf_counter()
            lowered.compile()
            split.append((round(t1 - t0, 4), round(time.perf_counter() - t1, 4)))
        except Exception as e:
            split.append(repr(e)[:80])
    out["one at a time (lower s, compile s)"] = split
    return out


def work_profiler_fallback(tiny):
    """The JAX profiler runs first; tuning afterwards must use the wall clock and
    finish, not abort the process."""
    import tempfile

    import jax

    from kerneltune._src.tuning.tuner import Tuner

    a, b = inputs((512, 512, 512) if not tiny else (64, 64, 64), tiny)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            jax.block_until_ready(a @ b)
    cands = [
        MatmulCfg(bm=64, bn=64, bk=32, warps=4, stages=2),
        MatmulCfg(bm=32 if tiny else 128, bn=64, bk=32, warps=4, stages=3),
    ]
    if tiny:
        cands = [
            MatmulCfg(bm=16, bn=16, bk=16, warps=4, stages=2),
            MatmulCfg(bm=32, bn=16, bk=16, warps=4, stages=3),
        ]
    report = Tuner(progress=False).tune(
        functools.partial(matmul, interpret=tiny), (a, b), {}, cands
    )
    return {"timer": report.timer, "timer_note": report.timer_note, "ok": report.best is not None}
