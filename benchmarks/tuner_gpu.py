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
- tune-jax: tune-jax 0.8.3, when it can be imported (nothing is installed here: put its
  wheel on PYTHONPATH as `benchmarks/README.md` says);
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
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.tuner_space import SHAPES, TINY_SHAPES, space  # noqa: E402

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


def worker(args: argparse.Namespace) -> None:
    """Runs one method (or diagnostic) in this process and prints its result."""
    from benchmarks import tuner_diag, tuner_methods
    from kerneltune._src.tuning.search import CoordinateDescent

    shape = tuple(int(x) for x in args.shape.split(",")) if args.shape else None
    tiny = args.tiny
    work = {
        "kt-exhaustive": lambda: tuner_methods.work_kerneltune(shape, tiny, "exhaustive"),
        "kt-wallclock": lambda: tuner_methods.work_kerneltune(
            shape, tiny, "exhaustive", timer="wallclock"
        ),
        "kt-coordinate": lambda: tuner_methods.work_kerneltune(shape, tiny, "coordinate"),
        "kt-batched": lambda: tuner_methods.work_kerneltune(
            shape, tiny, CoordinateDescent(pipelined=False)
        ),
        "original": lambda: tuner_methods.work_original(shape, tiny),
        "tune-jax": lambda: tuner_methods.work_tune_jax(shape, tiny),
        "reference": lambda: tuner_methods.work_reference(shape, tiny),
        "diag": lambda: tuner_diag.work_diag(tiny),
        "profiler-fallback": lambda: tuner_diag.work_profiler_fallback(tiny),
    }
    if args.worker not in work:
        raise SystemExit(f"unknown worker {args.worker!r}")
    print("RESULT " + json.dumps(work[args.worker]()), flush=True)


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
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tiny", action="store_true", help="small shapes in Pallas interpret mode (CPU check)"
    )
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated of {METHODS}")
    p.add_argument("--out", default=os.environ.get("OUT", ""), help="where to write JSON and logs")
    p.add_argument("--budget-s", type=float, default=450.0, help="stop starting workers after this")
    p.add_argument(
        "--worker-timeout-s", type=float, default=150.0, help="seconds per worker process"
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
