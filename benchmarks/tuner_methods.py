"""The tuner benchmark's methods, each run on one shape in a fresh process: kerneltune's
searches, the original system's method, tune-jax (when it imports) and the reference
measurement every winner is compared against."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.tuner_space import MatmulCfg, heuristic, inputs, matmul, space


def work_kerneltune(shape, tiny, strategy, timer="auto"):
    from kerneltune._src.tuning.tuner import Tuner

    a, b = inputs(shape, tiny)
    make_fn = functools.partial(matmul, interpret=tiny)
    tuner = Tuner(strategy=strategy, timer=timer, progress=False)
    start = time.perf_counter()
    report = tuner.tune(
        make_fn, (a, b), {}, space(tiny), reference_cfg=heuristic(tiny), name=f"matmul{shape}"
    )
    wall = time.perf_counter() - start
    statuses: dict[str, int] = {}
    for c in report.candidates:
        statuses[c.status] = statuses.get(c.status, 0) + 1
    compile_s = [c.compile_s for c in report.candidates if c.compile_s is not None]
    lower_s = [c.lower_s for c in report.candidates if c.lower_s is not None]
    return {
        "winner": dataclasses.asdict(report.best) if report.best else None,
        "wall_s": wall,
        "timer": report.timer,
        "timer_note": report.timer_note,
        "evaluated": report.num_evaluated,
        "statuses": statuses,
        "winner_time_s": report.best_time_s,
        "heuristic_time_s": report.heuristic_time_s,
        "compile_s_sum": sum(compile_s),
        "compile_s_max": max(compile_s, default=0.0),
        "lower_s_sum": sum(lower_s),
        "phases_s": report.phases_s,
        "times": {
            json.dumps(dataclasses.asdict(c.cfg)): c.time_s for c in report.candidates if c.ok
        },
    }


def work_original(shape, tiny):
    import jax

    a, b = inputs(shape, tiny)
    start = time.perf_counter()
    best, best_t = None, float("inf")
    for cfg in space(tiny):
        fn = jax.jit(matmul(cfg, interpret=tiny))
        try:
            jax.block_until_ready(fn(a, b))  # the warm-up, which also compiles
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(a, b))
                times.append(time.perf_counter() - t0)
        except Exception:  # a failing config is skipped, as the original did
            continue
        mean = sum(times) / len(times)
        if mean < best_t:
            best, best_t = cfg, mean
    wall = time.perf_counter() - start
    return {
        "winner": dataclasses.asdict(best) if best else None,
        "wall_s": wall,
        "timer": "wallclock-mean3",
    }


def work_tune_jax(shape, tiny):
    import jax

    if importlib.util.find_spec("tune_jax") is None:
        return {"skipped": "tune_jax is not installed"}
    import tune_jax

    a, b = inputs(shape, tiny)
    options = {
        f.name: sorted({getattr(c, f.name) for c in space(tiny)})
        for f in dataclasses.fields(MatmulCfg)
    }

    def fn(a, b, bm=64, bn=64, bk=32, warps=4, stages=2):
        return matmul(MatmulCfg(bm=bm, bn=bn, bk=bk, warps=warps, stages=stages), interpret=tiny)(
            a, b
        )

    tuned = tune_jax.tune(fn, hyperparams=options)
    start = time.perf_counter()
    jax.block_until_ready(tuned(a, b))
    wall = time.perf_counter() - start
    best = getattr(tuned, "optimal_hyperparams", None)
    return {
        "winner": {k: int(v) for k, v in dict(best).items()} if best else None,
        "wall_s": wall,
        "timer": "tune-jax",
        "version": getattr(tune_jax, "__version__", "0.8.3"),
    }


def work_reference(shape, tiny):
    """Every candidate, compiled in parallel, then measured with CUPTI (the wall clock
    in --tiny runs on a CPU) in 2 interleaved passes of 20 calls each, twice: on the
    same input buffers every time ("fixed"), and cycling through 4 copies of them, one
    copy per session, as the tuner does ("rotated")."""
    import jax
    import jax.numpy as jnp

    from kerneltune._src.tuning import programs, timing

    a, b = inputs(shape, tiny)
    copies = [(a, b)] + [(jnp.copy(a), jnp.copy(b)) for _ in range(3)]
    cands = space(tiny)

    def build(cfg):
        # One thread at a time lowers (`programs.lower_alone`): two threads tracing
        # Pallas kernels at once crash the process; the compiles overlap.
        try:
            return programs.lower_alone(matmul(cfg, interpret=tiny), (a, b)).compile()
        except Exception:
            return None

    with ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 1)) as pool:
        compiled = list(pool.map(build, cands))
    api = timing._measure_api() if not tiny else None

    def session(fn, args):
        if api is not None:
            measure, _, extra = api
            _, t = measure(fn, iterations=20, **extra)(*args)
            return [ms / 1e3 for ms in timing._timings_ms(t)]
        jax.block_until_ready(fn(*args))
        out = []
        for _ in range(20):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            out.append(time.perf_counter() - t0)
        return out

    result = {"timer": "cupti-median-of-40" if api else "wallclock-median-of-40"}
    for mode in ("fixed", "rotated"):
        samples: dict[int, list[float]] = {i: [] for i, c in enumerate(compiled) if c is not None}
        rng = random.Random(0)
        for p in range(2):
            order = list(samples)
            rng.shuffle(order)
            for n, i in enumerate(order):
                args = copies[(n + p) % len(copies)] if mode == "rotated" else copies[0]
                try:
                    samples[i] += session(compiled[i], args)
                except Exception as e:
                    print(f"reference: {cands[i]}: {type(e).__name__}: {e}"[:300], file=sys.stderr)
                    samples[i] = []
        key = "times" if mode == "fixed" else "times_rotated"
        result[key] = {
            json.dumps(dataclasses.asdict(cands[i])): statistics.median(s)
            for i, s in samples.items()
            if s
        }
    return result
