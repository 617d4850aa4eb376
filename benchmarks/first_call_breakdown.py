"""Where a first call's seconds go: lowering (tracing, kerneltune's selection, Pallas and
Mosaic lowering) against XLA's compile, and how much of the compile is XLA autotuning
its GEMMs, for kerneltune and the peers a user has, each in a fresh process.

`first_call_gpu.py` times every first call in one process, kerneltune's first; here
each (row, variant) gets a process of its own, so no variant inherits another's
warm-up (JAX's backend is up before the clock starts; its import and start are
reported apart). A row is one of `first_call_gpu.py`'s rows (same shapes, same
peers), run as a training step (the gradient of the sum of its output with respect to
every float input) unless `--forward`. kerneltune runs on its default executor with
an empty cache (`KERNELTUNE_CACHE_DIR` pointed at a fresh directory), so its first
call is what a new user's is at a shape no cache holds.

With `--compare`, each variant runs once more per named set of XLA compile options
(`XLA_OPTIONS`), each in a fresh process: `no_autotune` (`xla_gpu_autotune_level=0`,
XLA's GEMM autotuning off: the difference is what XLA spends autotuning, which no op
can skip for itself, the option being a whole program's) and `no_triton_gemm`
(`xla_gpu_enable_triton_gemm=False`: XLA's GEMMs left to cuBLAS, no Triton GEMM
fusions to autotune). Each compile's step is timed too (the median of `STEPS` calls
after the first, CUPTI device time on a GPU), so a cheaper compile is weighed against
the step it gives; the JSON also counts the Triton GEMM fusions in each compiled
program. `--no-autotune` is
`--compare no_autotune`.

    python -m benchmarks.first_call_breakdown --ops loss_head --labels 4096x3072->151936 --compare no_autotune,no_triton_gemm
    python -m benchmarks.first_call_breakdown --ops ragged_dot --labels "8192x4096x1024 E8"
    python -m benchmarks.first_call_breakdown --smoke   # tiny shapes, any device

Run from the repository root.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import fresh_process

#: XLA compile options a first call is compiled with: "default" (none given) and the
#: sets `--compare` may name, each a whole program's options.
XLA_OPTIONS: dict[str, dict[str, str | bool] | None] = {
    "default": None,
    "no_autotune": {"xla_gpu_autotune_level": "0"},
    "no_triton_gemm": {"xla_gpu_enable_triton_gemm": False},
}
#: Calls timed after the first for the step's median.
STEPS = 10


def _row(op: str, label: str, smoke: bool) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    from benchmarks import first_call_gpu

    for found, fn, args, peers in first_call_gpu.rows(op, smoke):
        if found == label:
            return fn, args, peers
    raise SystemExit(f"--labels: {op} has no row {label!r}")


def child(op: str, label: str, variant: str, options: str, grad: bool, smoke: bool) -> dict:
    """One first call in this process: seconds to import and start JAX, then to lower,
    compile (with `XLA_OPTIONS[options]`) and run a fresh `jax.jit` of the row's step
    once; then the step's median over `STEPS` more calls and the compiled program's
    Triton GEMM fusions."""
    start = time.perf_counter()
    import jax
    import jax.numpy as jnp

    import kerneltune as kt
    from benchmarks import first_call_gpu
    from benchmarks import harness as h

    jnp.zeros(1).block_until_ready()
    started = time.perf_counter() - start
    fn, args, peers = _row(op, label, smoke)
    if variant == "kerneltune":
        fn = functools.partial(fn, kt.default_executor())
    elif variant in peers:
        fn = peers[variant]
    else:
        raise SystemExit(f"--variants: {variant!r} is not kerneltune or a peer of {sorted(peers)}")
    step = first_call_gpu.step_of(fn, grad)
    jax.block_until_ready(args)
    t0 = time.perf_counter()
    lowered = jax.jit(step).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile(compiler_options=XLA_OPTIONS[options])
    t2 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    t3 = time.perf_counter()
    steps = h.call_times(compiled, [args], STEPS)  # CUPTI device time on a GPU
    return {
        "row": f"{op} {label}",
        "variant": variant,
        "options": options,
        "start_s": started,
        "lower_s": t1 - t0,
        "compile_s": t2 - t1,
        "first_call_s": t3 - t0,
        "step_ms": 1e3 * statistics.median(steps),
        "triton_gemms": compiled.as_text().count("__triton_gemm"),
    }


def run_child(
    op: str, label: str, variant: str, options: str, grad: bool, smoke: bool, timeout_s: float
) -> dict:
    """`child` in a fresh process with an empty cache directory; a failure is a result."""
    cmd = [sys.executable, "-m", "benchmarks.first_call_breakdown", "--child", op, label, variant]
    cmd += ["--options", options]
    cmd += [] if grad else ["--forward"]
    cmd += ["--smoke"] if smoke else []
    result = fresh_process.json_result(cmd, timeout_s=timeout_s)
    if "error" in result:
        return {"row": f"{op} {label}", "variant": variant, "options": options, **result}
    return result


def _s(result: dict | None, field: str) -> str:
    if result is None:
        return "-"
    if "error" in result:
        return "failed"
    return f"{result[field]:.2f}" if field in result else "-"


def table(results: Sequence[dict]) -> str:
    """Markdown: per row and variant, lowering, compile, first call and step with XLA's
    default options, the compile and step under each other set of options measured,
    and kerneltune's first call over the fastest peer's."""
    by = {(r["row"], r["variant"], r["options"]): r for r in results}
    rows = list(dict.fromkeys(r["row"] for r in results))
    others = [o for o in dict.fromkeys(r["options"] for r in results) if o != "default"]
    head = ["row", "variant", "lower s", "compile s", "first call s", "step ms"]
    head += [f"{what}, {o}" for o in others for what in ("compile s", "step ms")]
    lines = ["| " + " | ".join([*head, "÷ best peer"]) + " |", "|" + " --- |" * (len(head) + 1)]
    for row in rows:
        variants = list(dict.fromkeys(r["variant"] for r in results if r["row"] == row))
        firsts = {
            v: by[(row, v, "default")]["first_call_s"]
            for v in variants
            if (row, v, "default") in by and "error" not in by[(row, v, "default")]
        }
        peers = [t for v, t in firsts.items() if v != "kerneltune"]
        for v in variants:
            on = by.get((row, v, "default"))
            ratio = (
                f"{firsts[v] / min(peers):.2f}x"
                if v == "kerneltune" and v in firsts and peers
                else ""
            )
            cells = [
                row,
                v,
                *(_s(on, f) for f in ("lower_s", "compile_s", "first_call_s", "step_ms")),
            ]
            for o in others:
                cells += [_s(by.get((row, v, o)), f) for f in ("compile_s", "step_ms")]
            lines.append("| " + " | ".join([*cells, ratio]) + " |")
    return "\n".join(lines)


def listed(ops: Sequence[str], smoke: bool) -> list[tuple[str, str, list[str]]]:
    """`(op, label, peer names)` of each row of `ops`, read in a process of its own on
    the CPU: building a row makes its arrays, which this process must not hold on the
    GPU while the first calls run."""
    cmd = [sys.executable, "-m", "benchmarks.first_call_breakdown", "--list", ",".join(ops)]
    cmd += ["--smoke"] if smoke else []
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(done.stderr.strip().splitlines()[-1] if done.stderr else "--list failed")
    return [tuple(r) for r in json.loads(done.stdout.strip().splitlines()[-1])]


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="ragged_dot,loss_head", help="rows of first_call_gpu's ops")
    p.add_argument("--labels", default="", help="only these rows (comma-separated labels)")
    p.add_argument("--variants", default="", help="default: kerneltune and every peer")
    p.add_argument(
        "--compare",
        default="",
        help=f"also compile with these XLA option sets: {list(XLA_OPTIONS)[1:]}",
    )
    p.add_argument("--no-autotune", action="store_true", help="the same as --compare no_autotune")
    p.add_argument("--forward", action="store_true", help="the forward alone, no gradient")
    p.add_argument("--smoke", action="store_true", help="tiny shapes: a check of the script")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per process")
    p.add_argument("--json", default=None, help="write every result here")
    p.add_argument("--options", default="default", help=argparse.SUPPRESS)
    p.add_argument("--child", nargs=3, metavar=("OP", "LABEL", "VARIANT"), help=argparse.SUPPRESS)
    p.add_argument("--list", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    grad = not a.forward
    if a.child:
        op, label, variant = a.child
        print(json.dumps(child(op, label, variant, a.options, grad, a.smoke)), flush=True)
        return []
    if a.list is not None:
        from benchmarks import first_call_gpu

        found = [
            (op, label, list(peers))
            for op in a.list.split(",")
            for label, _, _, peers in first_call_gpu.rows(op, a.smoke)
        ]
        print(json.dumps(found))
        return []
    compare = [s for s in a.compare.split(",") if s] + (["no_autotune"] if a.no_autotune else [])
    unknown = [c for c in compare if c not in XLA_OPTIONS or c == "default"]
    if unknown:
        p.error(f"--compare: unknown option set(s) {unknown}; choose from {list(XLA_OPTIONS)[1:]}")
    ops = [s for s in a.ops.split(",") if s]
    wanted = [s for s in a.labels.split(",") if s]
    results = []
    for op, label, peers in listed(ops, a.smoke):
        if wanted and label not in wanted:
            continue
        variants = [v for v in a.variants.split(",") if v] or ["kerneltune", *peers]
        for options in ["default", *dict.fromkeys(compare)]:
            for v in variants:
                r = run_child(op, label, v, options, grad, a.smoke, a.timeout)
                print(json.dumps(r), flush=True)
                results.append(r)
    print(table(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
