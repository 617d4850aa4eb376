#!/usr/bin/env python3
"""How well and how fast the tuner picks a Pallas (Triton) matmul config on a GPU.

The space: bm, bn ∈ {64, 128, 256}, bk ∈ {32, 64}, warps ∈ {4, 8}, stages ∈ {2, 3, 4}
(108 candidates), bf16 inputs, on three shapes. Every (shape, method) runs in a fresh
process (nothing compiled yet, no compilation cache), with the inputs already on the
device; "wall" is the time from the tuning call to its return. Methods:

- kt-exhaustive: `Tuner(strategy="exhaustive")` (CUPTI device time, parallel compile);
- kt-coordinate: `Tuner(strategy="coordinate")`, the budgeted search (pipelined: a new
  candidate is proposed as each result lands);
- kt-batched: the same search in batches, each waiting for its slowest compile (for
  comparison);
- original: the original system's method: compile one by one, 1 warm-up, mean of 3
  wall-clock calls;
- tune-jax: tune-jax 0.8.3, when it can be imported (its wheel travels in `.whl/`);
- reference: every candidate compiled and measured with CUPTI (median of 2×20 calls),
  in a separate process: the regret of each method's winner is its reference time over
  the best reference time, minus one.

Run with no arguments on a GPU machine; it prints one table. On a CPU,
`--tiny` runs the same pipeline on small shapes in Pallas interpret mode (a check that
everything works, not a measurement). Other processes it starts: one "diag" process
(JAX versions, the CUPTI API and its overhead) and one "profiler-fallback" process
(tuning after the JAX profiler ran must fall back to the wall clock, not crash).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHAPES = [(4096, 4096, 2048), (8192, 1024, 4096), (1024, 1024, 8192)]
TINY_SHAPES = [(128, 128, 256), (256, 64, 128)]
METHODS = [
    "reference",
    "kt-exhaustive",
    "kt-coordinate",
    "kt-batched",
    "original",
    "tune-jax",
    "kt-wallclock",
]
#: Methods run on the first shape only (variants shown for comparison).
FIRST_SHAPE_ONLY = ("kt-wallclock",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatmulCfg:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int


def space(tiny: bool) -> list[MatmulCfg]:
    """The 108 candidates; 16 small ones for --tiny (interpret mode compiles slowly)."""
    if tiny:
        axes = ((16, 32), (16, 32), (16,), (4, 8), (2, 3))
    else:
        axes = ((64, 128, 256), (64, 128, 256), (32, 64), (4, 8), (2, 3, 4))
    return [
        MatmulCfg(bm=bm, bn=bn, bk=bk, warps=w, stages=s)
        for bm, bn, bk, w, s in itertools.product(*axes)
    ]


def heuristic(tiny: bool) -> MatmulCfg:
    return (
        MatmulCfg(bm=16, bn=16, bk=16, warps=4, stages=2)
        if tiny
        else MatmulCfg(bm=128, bn=128, bk=64, warps=4, stages=3)
    )


# --- the kernel -------------------------------------------------------------------------


def matmul(cfg: MatmulCfg, interpret: bool = False):
    """`a @ b` as a Pallas kernel: one (bm, bn) output tile per program, a loop over K
    in steps of bk accumulating in float32."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def f(a, b):
        m, k = a.shape
        _, n = b.shape
        if m % cfg.bm or n % cfg.bn or k % cfg.bk:
            raise ValueError(f"{cfg} does not divide {(m, n, k)}")

        def kernel(a_ref, b_ref, o_ref):
            def body(i, acc):
                start = pl.multiple_of(i * cfg.bk, cfg.bk)
                x = a_ref[:, pl.ds(start, cfg.bk)]
                y = b_ref[pl.ds(start, cfg.bk), :]
                return acc + jnp.dot(x, y, preferred_element_type=jnp.float32)

            acc = jax.lax.fori_loop(0, k // cfg.bk, body, jnp.zeros((cfg.bm, cfg.bn), jnp.float32))
            o_ref[...] = acc.astype(o_ref.dtype)

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
            grid=(m // cfg.bm, n // cfg.bn),
            in_specs=[
                pl.BlockSpec((cfg.bm, k), lambda i, j: (i, 0)),
                pl.BlockSpec((k, cfg.bn), lambda i, j: (0, j)),
            ],
            out_specs=pl.BlockSpec((cfg.bm, cfg.bn), lambda i, j: (i, j)),
            compiler_params=None if interpret else _triton_params(cfg),
            interpret=interpret,
        )(a, b)

    return f


def _triton_params(cfg: MatmulCfg):
    from jax.experimental.pallas import triton as plgpu

    params = getattr(plgpu, "CompilerParams", None) or plgpu.TritonCompilerParams
    return params(num_warps=cfg.warps, num_stages=cfg.stages)


def inputs(shape, tiny: bool):
    import jax
    import jax.numpy as jnp

    m, n, k = shape
    dtype = jnp.float32 if tiny else jnp.bfloat16
    ka, kb = jax.random.split(jax.random.PRNGKey(sum(shape)))
    a = jax.random.normal(ka, (m, k), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (k, n), jnp.float32).astype(dtype)
    return jax.block_until_ready(a), jax.block_until_ready(b)


# --- workers: one method on one shape, in this process -----------------------------------


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

    from kerneltune._src.tuning import timing

    a, b = inputs(shape, tiny)
    copies = [(a, b)] + [(jnp.copy(a), jnp.copy(b)) for _ in range(3)]
    cands = space(tiny)

    def build(cfg):
        try:
            return jax.jit(matmul(cfg, interpret=tiny)).lower(a, b).compile()
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
    that each lower and compile, the other half (odd positions: different configs, so
    no cache can help) through kerneltune's pool (one lowering thread feeding 16
    compile threads, largest configs first); and, one candidate at a time, how long
    lowering (Python, holds the GIL) and compiling (C++, releases it) take."""
    import jax

    from kerneltune._src.tuning import compile_cost
    from kerneltune._src.tuning import search as kt_search
    from kerneltune._src.tuning.compiling import CompilePool

    a, b = inputs(TINY_SHAPES[0] if tiny else SHAPES[0], tiny)
    cands = space(tiny)

    def lower(cfg):
        return jax.jit(matmul(cfg, interpret=tiny)).lower(a, b)

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
        prior = compile_cost.prior_size(kt_search.config_point(cfg))
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
            lowered = jax.jit(matmul(cfg, tiny)).lower(a, b)
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


def worker(args) -> None:
    shape = tuple(int(x) for x in args.shape.split(",")) if args.shape else None
    method = args.worker
    if method == "kt-exhaustive":
        result = work_kerneltune(shape, args.tiny, "exhaustive")
    elif method == "kt-wallclock":
        result = work_kerneltune(shape, args.tiny, "exhaustive", timer="wallclock")
    elif method == "kt-coordinate":
        result = work_kerneltune(shape, args.tiny, "coordinate")
    elif method == "kt-batched":
        from kerneltune._src.tuning.search import CoordinateDescent

        result = work_kerneltune(shape, args.tiny, CoordinateDescent(pipelined=False))
    elif method == "original":
        result = work_original(shape, args.tiny)
    elif method == "tune-jax":
        result = work_tune_jax(shape, args.tiny)
    elif method == "reference":
        result = work_reference(shape, args.tiny)
    elif method == "diag":
        result = work_diag(args.tiny)
    elif method == "profiler-fallback":
        result = work_profiler_fallback(args.tiny)
    else:
        raise SystemExit(f"unknown worker {method!r}")
    print("RESULT " + json.dumps(result), flush=True)


# --- the orchestrator --------------------------------------------------------------------


def install_missing_wheels(wheels: Path) -> dict[str, str]:
    """Puts wheels from `wheels` on the subprocesses' path, for the modules this Python
    lacks (tune-jax always); returns the environment for the workers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if not wheels.is_dir():
        return env
    target = Path("/tmp/kerneltune-bench-site")
    wanted = []
    for whl in sorted(wheels.glob("*.whl")):
        module = {"protobuf": "google.protobuf", "tune_jax": "tune_jax"}.get(
            whl.name.split("-")[0], whl.name.split("-")[0]
        )
        try:
            present = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            present = False
        if not present:
            wanted.append(str(whl))
    if wanted:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--target",
                str(target),
                *wanted,
            ],
            check=False,
        )
        env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + str(target)
        print(f"installed for the workers: {[Path(w).name for w in wanted]}", flush=True)
    return env


def run_worker(method, shape, args, env, timeout_s):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", method]
    if shape is not None:
        cmd += ["--shape", ",".join(map(str, shape))]
    if args.tiny:
        cmd.append("--tiny")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}, time.perf_counter() - start
    elapsed = time.perf_counter() - start
    if args.out:
        # One log file for all workers: only a few files come back from the GPU machine.
        with open(Path(args.out) / "worker_logs.txt", "a") as log:
            log.write(f"\n===== {method} {shape} (exit {proc.returncode}, {elapsed:.1f} s) =====\n")
            log.write(proc.stdout[-20000:] + "\n--- stderr ---\n" + proc.stderr[-20000:])
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :]), elapsed
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"[:400]}, elapsed


def regret(result, ref_times):
    winner = result.get("winner")
    if not winner or not ref_times:
        return None
    t = ref_times.get(json.dumps(winner))
    return None if t is None else t / min(ref_times.values()) - 1


def fmt_cfg(w):
    return "-" if not w else f"{w['bm']}x{w['bn']}x{w['bk']} w{w['warps']} s{w['stages']}"


def orchestrate(args) -> None:
    env = install_missing_wheels(Path(args.wheels))
    deadline = time.perf_counter() + args.budget_s
    out_dir = Path(args.out) if args.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    everything = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "tiny": args.tiny}
    for extra in ("diag", "profiler-fallback"):
        result, elapsed = run_worker(extra, None, args, env, 120)
        everything[extra] = result
        print(f"{extra} ({elapsed:.1f} s): {json.dumps(result)[:1500]}", flush=True)
    shapes = TINY_SHAPES if args.tiny else SHAPES
    methods = [m for m in METHODS if m in args.methods.split(",")]
    rows = []
    for shape in shapes:
        results = {}
        for method in methods:
            if method in FIRST_SHAPE_ONLY and shape != shapes[0]:
                continue
            left = deadline - time.perf_counter()
            if left < 20:
                results[method] = {"error": "skipped: out of time"}
                continue
            result, elapsed = run_worker(method, shape, args, env, min(args.worker_timeout_s, left))
            result["process_s"] = elapsed
            results[method] = result
            brief = {k: v for k, v in result.items() if k != "times"}
            print(f"{shape} {method} ({elapsed:.1f} s): {json.dumps(brief)[:600]}", flush=True)
        ref = results.get("reference", {})
        for method in methods:
            if method == "reference" or method not in results:
                continue
            r = results[method]
            regrets = (regret(r, ref.get("times") or {}), regret(r, ref.get("times_rotated") or {}))
            rows.append((shape, method, r, regrets))
        everything[str(shape)] = results
        if out_dir:
            (out_dir / "tuner_gpu.json").write_text(json.dumps(everything, indent=1))
    diag = everything.get("diag", {})
    print()
    print(
        f"# tuner_gpu: {diag.get('device_kind', '?')}, jax {diag.get('jax', '?')}, {everything['date']}"
    )
    header = (
        f"{'shape':<16} {'method':<14} {'wall s':>7} {'regret':>7} {'rot.':>6} {'evals':>5} "
        f"{'setup':>6} {'compile':>7} {'timing':>6} {'lower Σ':>7} {'timer':<16} winner"
    )
    print(header)
    print("-" * len(header))
    for shape, method, r, (reg, reg_rot) in rows:
        shape_s = "x".join(map(str, shape))
        if "error" in r or "skipped" in r:
            print(f"{shape_s:<16} {method:<14} {r.get('error') or r.get('skipped')}")
            continue
        pct = ["?" if x is None else f"{x * 100:.1f}%" for x in (reg, reg_rot)]
        evals = r.get("evaluated", len(space(args.tiny)))
        phases = r.get("phases_s") or {}
        cols = [f"{phases[k]:.2f}" if k in phases else "-" for k in ("setup", "compile", "timing")]
        lower = f"{r['lower_s_sum']:.2f}" if "lower_s_sum" in r else "-"
        print(
            f"{shape_s:<16} {method:<14} {r['wall_s']:>7.2f} {pct[0]:>7} {pct[1]:>6} {evals:>5} "
            f"{cols[0]:>6} {cols[1]:>7} {cols[2]:>6} {lower:>7} {r['timer']:<16} "
            f"{fmt_cfg(r['winner'])}"
        )
    for shape in shapes:
        res = everything.get(str(shape), {})
        ex, co = res.get("kt-exhaustive", {}), res.get("kt-coordinate", {})
        ba = res.get("kt-batched", {})
        if "wall_s" in ex and "wall_s" in co:
            extra = f", batched {ba['wall_s'] / ex['wall_s']:.0%}" if "wall_s" in ba else ""
            print(
                f"{'x'.join(map(str, shape))}: budgeted/exhaustive wall "
                f"{co['wall_s'] / ex['wall_s']:.0%}{extra}"
            )
    print(
        "regret: the winner's reference time over the best reference time, minus one; 'regret' "
        "against the reference on fixed buffers, 'rot.' against the one on rotated copies. "
        "setup/compile/timing: the tuner's phases (s); lower Σ: seconds spent tracing and "
        "lowering, summed over candidates (holds the GIL)."
    )
    if out_dir:
        (out_dir / "tuner_gpu.json").write_text(json.dumps(everything, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--tiny", action="store_true", help="small shapes in Pallas interpret mode (CPU check)"
    )
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--out", default=os.environ.get("OUT", ""), help="where to write JSON and logs")
    p.add_argument("--wheels", default=str(ROOT / ".whl"))
    p.add_argument("--budget-s", type=float, default=450.0, help="stop starting workers after this")
    p.add_argument("--worker-timeout-s", type=float, default=150.0)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
