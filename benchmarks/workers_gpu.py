"""`kerneltune tune --workers` on this machine's GPUs: the same manifest tuned in
process, in one worker and in two, each from an empty cache; prints each run's wall
time and keys, and the winners that differ from the in-process run.

    PYTHONPATH=. python -m benchmarks.workers_gpu [OUT_DIR]

A run that fails (non-zero exit, or no configs written) is reported with its last
error line, and the script then exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
import kerneltune.kernels as ops
from benchmarks.harness import on_gpu


def normal(*shape: int) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(sum(shape)), shape, jnp.bfloat16)


def record(path: str) -> int:
    """Records 13 calls: layer_norm, rms_norm and softmax at 4 shapes, one attention."""
    kt.clear_invocations()
    with kt.policy_override(autotune=False), kt.record_calls():
        for r, w in ((4096, 1024), (8192, 2048), (2048, 4096), (16384, 3072)):
            ops.layer_norm(normal(r, w), normal(w), normal(w))
            ops.rms_norm(normal(r, w), normal(w))
            ops.softmax(normal(r, w))
        q = normal(4, 2048, 8, 128)
        ops.attention(q, q, q, is_causal=True)
    return kt.save_manifest(path)


def entries(path: str) -> dict[tuple[str, str], dict[str, Any]]:
    with open(path) as f:
        return {(e["op_id"], e["call_key"]): e for e in json.load(f)["entries"]}


def main(argv: list[str] | None = None) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "out_dir", nargs="?", default=None, help="where the manifest and each run's configs go "
        "(default: a new temporary directory)"
    )  # fmt: skip
    args = p.parse_args(argv)
    if not on_gpu():
        # On a CPU every key is untuned (no Pallas backend runs): nothing to compare.
        sys.exit(f"workers_gpu: needs a GPU (found {jax.devices()[0].platform})")
    out = os.path.abspath(args.out_dir or tempfile.mkdtemp(prefix="kt-workers-"))
    os.makedirs(out, exist_ok=True)
    manifest = os.path.join(out, "calls.json")
    print(f"recorded {record(manifest)} calls", flush=True)
    runs: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    failed = []
    for name, extra in (("in-process", []), ("--workers 1", ["--workers", "1"]),
                        ("--workers 2", ["--workers", "2"])):  # fmt: skip
        result = os.path.join(out, name.strip("-").replace(" ", "") + ".json")
        cmd = [sys.executable, "-m", "kerneltune", "--cache-dir", tempfile.mkdtemp(), "tune",
               manifest, "--out", result, "--no-progress", "--import", "kerneltune.kernels",
               *extra]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        runs[name] = entries(result) if os.path.exists(result) else {}
        last = " | ".join(done.stdout.strip().splitlines()[-2:])
        print(f"{name:12s} exit {done.returncode}  {wall:5.1f} s  {len(runs[name])} keys  {last}")
        if done.returncode != 0 or not runs[name]:
            errors = done.stderr.strip().splitlines()
            failed.append(
                f"{name}: exit {done.returncode}: {errors[-1] if errors else 'no output'}"
            )
    base = runs["in-process"]
    for name in ("--workers 1", "--workers 2"):
        if not base or not runs[name]:
            continue  # a failed run has no winners to compare
        differ = [k for k, e in runs[name].items() if k in base and e["cfg"] != base[k]["cfg"]]
        print(f"{name}: same keys as in-process: {set(runs[name]) == set(base)}; "
              f"winners differing: {len(differ)}")  # fmt: skip
    if failed:
        sys.exit("workers_gpu: failed runs:\n  " + "\n  ".join(failed))
    return runs


if __name__ == "__main__":
    main()
