"""Two processes, one GPU each, tune the bundled matmul and must end with one config.

Run on a machine with (at least) two GPUs:

    python benchmarks/agreement_gpu.py                # 2 processes, GPUs 0 and 1
    python benchmarks/agreement_gpu.py --processes 4  # 4 processes, one GPU each

The launcher starts one worker per GPU (CUDA_VISIBLE_DEVICES=i) joined by
`jax.distributed.initialize` on localhost. Each worker tunes two calls of the Pallas
matmul (a direct call and one inside `jax.jit`, different shapes), prints what it would
have picked alone, what the processes agreed on, and how long tuning and agreeing took,
then runs `verify_agreement`. The launcher prints a table and exits non-zero when the
processes disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: argparse.Namespace) -> int:
    port = _free_port()
    procs = []
    for pid in range(args.processes):
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": str(pid),
            "KERNELTUNE_CACHE_DIR": "off",
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1",
        }
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            str(pid),
            "--processes",
            str(args.processes),
            "--port",
            str(port),
            "--sizes",
            *map(str, args.sizes),
        ]
        if args.interpret:
            cmd.append("--interpret")
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    deadline = time.monotonic() + args.timeout
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print(f"timed out after {args.timeout} s", file=sys.stderr)
            return 2
        for line in out.splitlines():
            if line.startswith("RESULT "):
                results.append(json.loads(line[len("RESULT ") :]))
            elif "kerneltune" in line or "agreed" in line or "Error" in line:
                print(f"  [p{len(results)}] {line}")
        if p.returncode != 0:
            print(out[-4000:], file=sys.stderr)
            return p.returncode or 1
    return report(results)


def report(results: list[dict]) -> int:
    calls = [c for c in results[0]["calls"]]
    same = True
    print()
    print(
        f"{'process':>7}  {'device':<22} {'call':<36} {'tune s':>7} {'agree s':>8}  "
        f"{'alone it picks (ms)':<44} agreed (its local ms)"
    )
    for r in results:
        for call in r["calls"]:
            alone = f"{call['local']} ({call['local_ms']:.4f})"
            print(
                f"{r['process']:>7}  {r['device']:<22} {call['what']:<36} {call['tune_s']:>7.1f} "
                f"{call['agree_s']:>8.3f}  {alone:<44} "
                f"{call['agreed']} ({call['agreed_local_ms']:.4f})"
            )
    for i, call in enumerate(calls):
        agreed = {r["calls"][i]["agreed"] for r in results}
        local = {r["calls"][i]["local"] for r in results}
        same &= len(agreed) == 1
        print(
            f"{call['what']}: {len(agreed)} distinct agreed config(s) across {len(results)} processes; "
            f"{len(local)} distinct local winner(s)"
        )
    print("verify_agreement:", [r["verify"] for r in results])
    print("IDENTICAL" if same and all(r["verify_ok"] for r in results) else "DIFFERENT")
    return 0 if same else 1


def worker(args: argparse.Namespace) -> None:
    import jax

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.processes,
        process_id=args.worker,
        initialization_timeout=120,
    )
    import logging

    import jax.numpy as jnp

    import kerneltune as kt
    from kerneltune import verify_agreement
    from kerneltune._src.tuning import distributed
    from kerneltune.kernels.matmul.api import Matmul, MatmulInterpret

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    waits: list[float] = []
    original = distributed.agree

    def timed_agree(*a, **k):
        start = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            waits.append(time.perf_counter() - start)

    distributed.agree = timed_agree  # the chain looks it up at call time

    chain = kt.ConfigSelectorChain(kt.ConfigCache(), tuner=kt.Tuner(progress=False))
    ex = kt.Executor(chain)
    kernel = (MatmulInterpret if args.interpret else Matmul)(executor=ex)
    calls = []
    for i, n in enumerate(args.sizes):
        kx, ky = jax.random.split(jax.random.key(n))
        dtype = jnp.float32 if args.interpret else jnp.bfloat16
        x = jax.random.normal(kx, (n, n), dtype)
        y = jax.random.normal(ky, (n, n), dtype)
        jitted = i % 2 == 1
        what = f"{'jit ' if jitted else ''}{kernel.op_id} {n}x{n}x{n} {jnp.dtype(dtype).name}"
        start = time.perf_counter()
        if jitted:
            jax.jit(lambda a, b: ex(kernel, a, b))(x, y).block_until_ready()
        else:
            ex(kernel, x, y).block_until_ready()
        took = time.perf_counter() - start
        inv = _invocation(kernel, x, y)
        key = (inv.device_fingerprint, inv.op_id_v, inv.call_key)
        agreed, rep = chain.cache.get(*key), chain.report_for(*key)
        ok = [c for c in rep.candidates if c.ok]
        local = min(ok, key=lambda c: c.time_s)
        agreed_local = [c.time_s for c in ok if c.cfg == agreed]
        calls.append(
            {
                "what": what,
                "tune_s": took,
                "agree_s": waits[-1] if waits else 0.0,
                "timer": rep.timer,
                "candidates": len(rep.candidates),
                "ok": len(ok),
                "local": _short(local.cfg),
                "local_ms": local.time_s * 1e3,
                "agreed": _short(agreed),
                "agreed_local_ms": agreed_local[0] * 1e3 if agreed_local else float("nan"),
            }
        )
    check = verify_agreement(chain, raise_on_mismatch=False)
    print(
        "RESULT "
        + json.dumps(
            {
                "process": args.worker,
                "device": jax.local_devices()[0].device_kind,
                "calls": calls,
                "verify": check.summary(),
                "verify_ok": check.ok,
            }
        ),
        flush=True,
    )


def _invocation(kernel, x, y):
    from kerneltune._src.kernel.base import make_invocation

    a, k = kernel.prepare(x, y)
    return make_invocation(kernel, a, k)


def _short(cfg) -> str:
    return f"bm{cfg.block_m} bn{cfg.block_n} bk{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} g{cfg.group_m}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--processes", type=int, default=2, help="worker processes, one GPU each (default 2)"
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[2048, 4096],
        help="square matmul sizes; every second one is called inside jax.jit",
    )
    parser.add_argument(
        "--timeout", type=float, default=280.0, help="seconds before the workers are stopped"
    )
    parser.add_argument(
        "--interpret",
        action="store_true",
        help="tune the Pallas interpreter's matmul (a CPU smoke test; timings mean little)",
    )
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
