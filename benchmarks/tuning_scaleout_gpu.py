"""The GPT block's training step (`benchmarks/model_gpu.py`) tuned from an empty cache
with one GPU, with `kerneltune tune --workers N`, and as an N-process JAX job: what a
second (and a fourth) GPU buys the tuning of a model (issue 46).

Every run starts from an empty persistent cache of its own, with the shipped tables left
out (`KERNELTUNE_SHIPPED=0`), so that every key is tuned:

- `1 process`: `kt.autotune(step, params, x)` in one process on one GPU;
- `--workers N`: the calls the step records (`kt.record_calls`, a manifest), tuned by
  `kerneltune tune MANIFEST --workers N`: N worker processes, one GPU each, joined as
  one JAX job (each family's costliest key tuned together, the others dealt);
- `N processes`: N processes on this host, one GPU each, joined by
  `jax.distributed.initialize`, each calling `kt.autotune(step, params, x)`: the
  processes tune each family's first key together (a slice of its candidates each),
  deal the other keys, and all end with every config.

Printed per run: the wall time (process start to the last result, JAX's import and
start included), the keys, the keys tuned together, the keys each worker was dealt (as
`kerneltune tune` prints them) or each process tuned alone (its "autotune_finish"
events), whether every key was tuned exactly once (the processes': no key alone twice,
a key tuned together by all), whether every process ended with the same configs, and the wall over the
1-process wall (the issue's bar: ≤ 0.6 with 2 GPUs). For the processes, the wall's two
parts: start-up (launch to the step built, the slowest process) and tuning (the most
seconds one process spent on its own keys): only the second can shrink with GPUs.

    python -m benchmarks.tuning_scaleout_gpu [--counts 2,4] [--json OUT.json]
    python -m benchmarks.tuning_scaleout_gpu --smoke   # a tiny block on CPU processes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

#: A run's processes are killed after this many seconds.
TIMEOUT_S = 900


@dataclasses.dataclass
class Run:
    """One way of tuning the block.

    Attributes:
      name: "1 process", "--workers N" or "N processes".
      wall_s: process start to the last result (None when it failed).
      keys: the tuned configs the run ended with.
      tuned_by: for each worker, the keys dealt to it (as `kerneltune tune` printed
        them); for each process, the keys it tuned alone.
      shared: the keys every process tuned together, each timing a slice of their
        candidates (each family's first key, `split.py`).
      tuned: the keys the run's processes tuned themselves, all together (not for
        `--workers`).
      once: every key was tuned by exactly one worker or process.
      identical: every process ended with the same configs (None for one process).
      startup_s: the slowest process's seconds from launch to its step built (JAX's
        import and start, `jax.distributed.initialize`); None for `--workers`.
      tuning_s: the most seconds one process spent tuning its own keys (the sum of its
        keys' autotune start-to-finish); None for `--workers`.
      error: why the run failed ("" when it did not).
    """

    name: str
    wall_s: float | None = None
    keys: int = 0
    tuned_by: list[int] = dataclasses.field(default_factory=list)
    shared: int = 0
    tuned: list[str] = dataclasses.field(default_factory=list)
    once: bool | None = None
    identical: bool | None = None
    startup_s: float | None = None
    tuning_s: float | None = None
    error: str = ""


def _env(cache: str, smoke: bool, gpu: str | None = None) -> dict[str, str]:
    env = dict(os.environ, KERNELTUNE_CACHE_DIR=cache, KERNELTUNE_SHIPPED="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _block(smoke: bool) -> tuple[Any, tuple[Any, ...]]:
    """The GPT block's training step on kerneltune's ops, and its arguments."""
    import jax

    from benchmarks import model_blocks as mb
    from benchmarks import model_gpu

    s = model_gpu.GPT_SMOKE if smoke else model_gpu.GPT
    # One program draws every input: drawn op by op, each new shape compiles its own
    # small programs (3 s of every run's start-up on a CPU).
    inputs = jax.jit(lambda: mb.block_inputs("gpt", s))()
    return mb.train_step("gpt", mb.kerneltune_ops(), s), inputs


def _configs(result: Any) -> dict[str, Any]:
    """`{"op call_key": config fields}` of an `AutotuningResult`."""
    doc = json.loads(result.dumps())
    return {f"{e['op_id']} {e['call_key']}": e.get("cfg") for e in doc["entries"]}


def _per_key(result: Any) -> dict[str, str]:
    """`{"op call_key": "wall s, strategy, candidates timed of all"}`: where the tuning
    time of a run went (a cold key searches far more of its space than a warm one)."""
    out = {}
    for e in json.loads(result.dumps())["entries"]:
        timed = sum(1 for t in e.get("candidates") or () if t.get("time_s") is not None)
        every = len(e.get("candidates") or ())
        out[f"{e['op_id']} {e['call_key']}"] = (
            f"{e.get('wall_s') or 0:.1f} s, {e.get('strategy')}, {timed} of {every} timed"
        )
    return out


def worker(args: argparse.Namespace) -> None:
    """One process of a run: tunes the block with `kt.autotune` and writes what it
    tuned itself and the configs it ended with to `args.out`."""
    launched = args.launched or time.time()
    marks = {"python": time.time() - launched}
    import jax

    marks["jax imported"] = time.time() - launched
    if args.processes > 1:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{args.port}",
            num_processes=args.processes,
            process_id=args.worker,
            initialization_timeout=120,
        )
    jax.devices()
    marks["devices up"] = time.time() - launched
    import kerneltune as kt

    marks["kerneltune imported"] = time.time() - launched
    mine: list[str] = []
    shared: list[str] = []
    started: dict[str, float] = {}
    tuning = [0.0]

    def on_event(event: str, **data: Any) -> None:
        key = f"{data.get('op_id')} {data.get('call_key')}"
        if event == "autotune_start":
            started[key] = time.perf_counter()
        if event == "autotune_finish":
            # A key tuned together with the other processes says so in its strategy.
            together = "shared by" in (getattr(data.get("report"), "strategy", "") or "")
            (shared if together else mine).append(key)
            tuning[0] += time.perf_counter() - started.pop(key, time.perf_counter())

    kt.default_executor().chooser.on_event = on_event
    step, block_args = _block(args.smoke)
    startup = time.time() - launched
    marks["step built"] = startup
    result = kt.autotune(step, *block_args)
    marks["tuned"] = time.time() - launched
    doc = {
        "tuned": sorted(set(mine)),
        "shared": sorted(set(shared)),
        "configs": _configs(result),
        "per_key": _per_key(result),
    }
    with open(args.out, "w") as f:
        json.dump({**doc, "startup_s": startup, "tuning_s": tuning[0], "marks": marks}, f)
    # The parent reads how long the process took to exit after this (JAX's shutdown).
    with open(args.out + ".done", "w") as f:
        f.write(repr(time.time()))


def _processes(n: int, smoke: bool, workdir: str) -> Run:
    """`n` processes (one GPU each) tuning the block together; n = 1: one process."""
    run = Run("1 process" if n == 1 else f"{n} processes")
    port = _free_port()
    outs = [os.path.join(workdir, f"p{n}-{i}.json") for i in range(n)]
    start = time.perf_counter()
    procs = []
    for i in range(n):
        cmd = [sys.executable, "-m", "benchmarks.tuning_scaleout_gpu", "--worker", str(i),
               "--processes", str(n), "--port", str(port), "--out", outs[i],
               "--launched", repr(time.time())]  # fmt: skip
        if smoke:
            cmd.append("--smoke")
        env = _env(os.path.join(workdir, f"cache-p{n}-{i}"), smoke, None if smoke else str(i))
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))  # fmt: skip
    logs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            run.error = f"timed out after {TIMEOUT_S} s"
            return run
        logs.append(out)
    run.wall_s = time.perf_counter() - start
    ended = time.time()
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        run.error = f"process {failed[0]} exited with {procs[failed[0]].returncode}"
        print(logs[failed[0]][-3000:], file=sys.stderr)
        return run
    docs = []
    for path in outs:
        with open(path) as f:
            docs.append(json.load(f))
    run.keys = len(docs[0]["configs"])
    for i, (d, path) in enumerate(zip(docs, outs)):
        with open(path + ".done") as f:
            exit_s = ended - float(f.read())
        # Seconds from launch at which each phase ended: where the start-up goes.
        phases = ", ".join(f"{k} {v:.1f}" for k, v in d.get("marks", {}).items())
        print(f"    process {i}: {phases}, exited {exit_s:.1f} s after", file=sys.stderr)
    for i, d in enumerate(docs):
        for key in d["shared"] + d["tuned"]:
            together = " (together)" if key in d["shared"] else ""
            print(
                f"    process {i}: {key}{together}: {d['per_key'].get(key, '?')}", file=sys.stderr
            )
    run.tuned_by = [len(d["tuned"]) for d in docs]
    shared = {k for d in docs for k in d["shared"]}
    run.shared = len(shared)
    run.tuned = [k for d in docs for k in d["tuned"]] + sorted(shared)
    # Once: no key tuned alone twice, and a key tuned together by every process.
    run.once = len(run.tuned) == len(set(run.tuned)) and all(
        set(d["shared"]) == shared for d in docs
    )
    run.startup_s = max(d["startup_s"] for d in docs)
    run.tuning_s = max(d["tuning_s"] for d in docs)
    if n > 1:
        run.identical = all(d["configs"] == docs[0]["configs"] for d in docs)
    return run


def _workers(n: int, smoke: bool, workdir: str) -> Run:
    """`kerneltune tune --workers n` over the manifest the block's step records."""
    run = Run(f"--workers {n}")
    manifest = os.path.join(workdir, "calls.json")
    if not os.path.exists(manifest):
        record = [sys.executable, "-m", "benchmarks.tuning_scaleout_gpu", "--record", manifest]
        done = subprocess.run(
            record + (["--smoke"] if smoke else []),
            env=_env(os.path.join(workdir, "cache-record"), smoke),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            run.error = f"recording exited with {done.returncode}"
            print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
            return run
    result = os.path.join(workdir, f"workers{n}.json")
    cmd = [sys.executable, "-m", "kerneltune", "tune", manifest, "--out", result,
           "--no-progress", "--workers", str(n), "--import", "kerneltune.kernels"]  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(
            cmd,
            env=_env(os.path.join(workdir, f"cache-w{n}"), smoke),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        run.error = f"timed out after {TIMEOUT_S} s"
        return run
    run.wall_s = time.perf_counter() - start
    if done.returncode != 0 or not os.path.exists(result):
        run.error = f"kerneltune tune exited with {done.returncode}"
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
        return run
    with open(result) as f:
        run.keys = len(json.load(f)["entries"])
    # The worker table `kerneltune tune` prints: worker, gpu, keys together, keys
    # alone, with a config, exit.
    for line in done.stdout.splitlines():
        cells = line.split()
        if len(cells) == 6 and cells[0].isdigit() and cells[2].isdigit() and cells[3].isdigit():
            run.shared = int(cells[2])
            run.tuned_by.append(int(cells[3]))
    run.once = sum(run.tuned_by) + run.shared == run.keys if run.tuned_by else None
    return run


def record(path: str, smoke: bool) -> None:
    """Records the block's kerneltune calls (traced, nothing tuned) to `path`."""
    import jax

    import kerneltune as kt

    step, block_args = _block(smoke)
    kt.clear_invocations()
    with kt.policy_override(autotune=False), kt.record_calls():
        jax.jit(step).lower(*block_args)
    kt.save_manifest(path)


def table(runs: Sequence[Run]) -> str:
    base = next((r.wall_s for r in runs if r.name == "1 process" and r.wall_s), None)
    lines = [["run", "wall s", "÷ 1 process", "start-up s", "tuning s", "keys", "together",
              "keys each", "each key once", "same configs"]]  # fmt: skip
    for r in runs:
        lines.append([
            r.name,
            r.error or f"{r.wall_s:.1f}",
            "-" if not (base and r.wall_s) else f"{r.wall_s / base:.2f}",
            "-" if r.startup_s is None else f"{r.startup_s:.1f}",
            "-" if r.tuning_s is None else f"{r.tuning_s:.1f}",
            str(r.keys),
            str(r.shared),
            " ".join(map(str, r.tuned_by)) or "-",
            "-" if r.once is None else ("yes" if r.once else "NO"),
            "-" if r.identical is None else ("yes" if r.identical else "NO"),
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--counts", default=None, help="GPU counts besides 1 (default: 2, 4 up to the GPUs here)"
    )
    p.add_argument("--smoke", action="store_true", help="a tiny block on CPU processes")
    p.add_argument("--json", metavar="PATH", help="also write the runs here")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--launched", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--record", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[Run]:
    args = parse(argv)
    if args.worker is not None:
        worker(args)
        return []
    if args.record is not None:
        record(args.record, args.smoke)
        return []
    if args.counts:
        counts = [int(c) for c in args.counts.split(",")]
    elif args.smoke:
        counts = [2]
    else:
        gpus = int(
            subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count(
                "GPU "
            )
        )
        counts = [c for c in (2, 4) if c <= gpus]
    workdir = tempfile.mkdtemp(prefix="kt-scaleout-")
    runs = [_processes(1, args.smoke, workdir)]
    print(
        f"  {runs[-1].name}: {runs[-1].error or f'{runs[-1].wall_s:.1f} s'}",
        file=sys.stderr,
        flush=True,
    )
    for n in counts:
        for make in (_workers, _processes):
            runs.append(make(n, args.smoke, workdir))
            print(
                f"  {runs[-1].name}: {runs[-1].error or f'{runs[-1].wall_s:.1f} s'}",
                file=sys.stderr,
                flush=True,
            )
    alone = set(runs[0].tuned)
    for r in runs[1:]:
        if r.name.endswith("processes") and r.once:
            r.once = set(r.tuned) == alone
    print("GPT block, tuned from an empty cache (no shipped tables):")
    print(table(runs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in runs], f, indent=1)
    return runs


if __name__ == "__main__":
    main()
