"""`kerneltune tune --workers N`: one worker process per local GPU, joined as one JAX job.

The parent never starts JAX: a JAX process that touched a GPU holds most of its memory,
which would starve the workers. It starts one `kerneltune tune` per worker on its own
GPU (`CUDA_VISIBLE_DEVICES`), joined by `jax.distributed` as the processes of one job,
and each tunes as any process of a job does (`split.py`): each family's costliest key
by all of them together, each timing a slice of its candidates, the other keys dealt
by estimated cost and tuned warm from those. Dealt whole instead, every worker paid a
cold search of its own: on 2 H200s a GPT block's tuning took 23.6 s with 2 workers and
23.7 s with one process (BENCHMARKS.md, 2026-11-28), against 16.7 s for a 2-process job.

A worker rewrites its result file after every key it tunes. A job cannot finish
without all its processes, so once a worker dies the parent stops each of the others
when its file holds every key it was to tune (or when it gives up waiting for the dead
one: `KERNELTUNE_AGREE_TIMEOUT`), and names the keys left without a config.

On a machine without GPUs the workers are plain processes (e.g. to tune several CPU
shapes at once, or to test this module).
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from kerneltune._src.core import files

#: What a worker's key file holds: `{"keys": [[op_id_v, call_key], ...]}`.
_KEYS_KIND = "kerneltune-worker-keys"


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The GPU ids this process may use, found without starting JAX or CUDA.

    `CUDA_VISIBLE_DEVICES` when set (an empty value or `-1` hides every GPU), else
    the GPUs the NVIDIA driver lists under `/proc/driver/nvidia/gpus`.

    Example:
      >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "0,2"})
      ['0', '2']
      >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"})
      []
    """
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        ids = [s.strip() for s in env["CUDA_VISIBLE_DEVICES"].split(",") if s.strip()]
        return [] if not ids or ids[0] == "-1" else ids
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def estimated_cost(record: Any) -> float:
    """A cost estimate for tuning one recorded call: the elements its array arguments
    hold (bigger problems take longer to time), at least 1."""
    total = 0.0
    for arg in record.args:
        shape = getattr(arg, "shape", None)
        if shape is None:
            continue
        size = 1.0
        for d in shape:
            size *= d if isinstance(d, int) else 1
        total += size
    return max(total, 1.0)


def deal_by_cost(records: Sequence[Any], count: int) -> list[list[Any]]:
    """Deals `records` to `count` workers: most expensive first, each to the worker
    with the least estimated work so far (ties: the lowest index). Deterministic: the
    same records give the same deal in every process.

    Example:
      >>> from types import SimpleNamespace as R
      >>> recs = [R(op_id_v="op@v0", call_key=k, args=()) for k in "abcd"]
      >>> [[r.call_key for r in part] for part in deal_by_cost(recs, 2)]
      [['a', 'c'], ['b', 'd']]
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}.")
    ordered = sorted(records, key=lambda r: (-estimated_cost(r), r.op_id_v, r.call_key))
    parts: list[list[Any]] = [[] for _ in range(count)]
    load = [(0.0, i) for i in range(count)]
    for record in ordered:
        work, i = heapq.heappop(load)
        parts[i].append(record)
        heapq.heappush(load, (work + estimated_cost(record), i))
    return parts


def write_keys(path: str, records: Sequence[Any]) -> None:
    """Writes the keys a worker must tune."""
    import json

    doc = {"kind": _KEYS_KIND, "keys": [[r.op_id_v, r.call_key] for r in records]}
    files.write_atomic(path, json.dumps(doc).encode())


def read_keys(path: str) -> set[tuple[str, str]]:
    """The keys written by `write_keys`.

    Raises:
      ValueError: not such a file.
    """
    doc = files.read_json(path)
    keys = doc.get("keys") if isinstance(doc, dict) and doc.get("kind") == _KEYS_KIND else None
    if not isinstance(keys, list) or not all(
        isinstance(k, list) and len(k) == 2 and all(isinstance(s, str) for s in k) for k in keys
    ):
        raise ValueError(f"{path} is not a worker key file")
    return {(k[0], k[1]) for k in keys}


@dataclasses.dataclass(frozen=True)
class WorkerRun:
    """What one worker was to tune and what came back.

    Attributes:
      index: the worker's number (its process id in the job).
      gpu: the GPU it ran on (None: a plain process).
      together: the keys it was to tune with every other worker (the seeds).
      alone: the keys it was to tune by itself.
      returncode: its exit status (negative: stopped by a signal, see `stopped`).
      finished: the keys its result file holds.
      stopped: the parent stopped it after another worker died.
      log: its output.
    """

    index: int
    gpu: str | None
    together: tuple[Any, ...]
    alone: tuple[Any, ...]
    returncode: int
    finished: frozenset[tuple[str, str]]
    log: str
    stopped: bool = False


@dataclasses.dataclass(frozen=True)
class WorkerCommand:
    """What every worker process of `kerneltune tune` is told: the manifest, the modules
    that define its kernels, the cache, and the `--op` and `--force` of its parent."""

    manifest: str
    imports: Sequence[str] = ()
    cache_dir: str | None = None
    op: str | None = None
    force: bool = False

    def argv(self, keys_path: str, out_path: str, *extra: str) -> list[str]:
        """The worker's command line: tune the keys in `keys_path`, write to `out_path`."""
        argv = [sys.executable, "-m", "kerneltune"]
        argv += ["--cache-dir", self.cache_dir] if self.cache_dir is not None else []
        argv += ["tune", self.manifest, "--keys", keys_path, "--out", out_path, "--no-progress"]
        argv += [a for name in self.imports for a in ("--import", name)]
        argv += ["--op", self.op] if self.op else []
        argv += ["--force"] if self.force else []
        return argv + list(extra)


def run_workers(
    records: Sequence[Any],
    plans: Sequence[Any],
    command: WorkerCommand,
    *,
    gpus: Sequence[str] = (),
    poll_s: float = 0.2,
) -> tuple[Any, list[WorkerRun]]:
    """Tunes `records` in one worker process per plan, joined as one JAX job, and
    merges their results.

    Args:
      records: what to tune.
      plans: per worker, what it will tune (`split.plans_for`: `seeds` with every
        other worker, `share` alone); the workers derive the same plans themselves.
      command: what every worker is told.
      gpus: the GPU of each worker, in order (none: plain processes).
      poll_s: how often the parent looks at its workers.

    Returns:
      `(result, runs)`: the merged `AutotuningResult` (None when no worker finished a
      key) and one `WorkerRun` per worker.
    """
    count = len(plans)
    coordinator = f"127.0.0.1:{_free_port()}"
    with tempfile.TemporaryDirectory(prefix="kerneltune-workers-") as tmp:
        keys_path = os.path.join(tmp, "keys.json")
        write_keys(keys_path, records)
        workers = []
        for i, worker_plan in enumerate(plans):
            out_path = os.path.join(tmp, f"result{i}.json")
            log_path = os.path.join(tmp, f"log{i}.txt")
            job = ("--coordinator", coordinator, "--processes", str(count), "--process-id", str(i))
            env = dict(os.environ)
            gpu = gpus[i] if i < len(gpus) else None
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
            log = open(log_path, "w")  # closed once the process ends
            proc = subprocess.Popen(
                command.argv(keys_path, out_path, *job),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            workers.append(_Worker(i, gpu, worker_plan, out_path, log_path, log, proc))
        _wait(workers, poll_s)
        runs, results = [], []
        for w in workers:
            w.log.close()
            result = load_result(w.out_path)
            if result is not None:
                results.append(result)
            with open(w.log_path, errors="replace") as f:
                text = f.read()
            runs.append(
                WorkerRun(w.index, w.gpu, tuple(w.plan.seeds), tuple(w.plan.share),
                          w.proc.returncode, frozenset(_keys(result)), text, w.stopped)
            )  # fmt: skip
    merged = None
    for result in results:
        merged = result if merged is None else merged | result
    return merged, runs


@dataclasses.dataclass
class _Worker:
    index: int
    gpu: str | None
    plan: Any
    out_path: str
    log_path: str
    log: Any
    proc: subprocess.Popen[bytes]
    stopped: bool = False

    @property
    def keys(self) -> set[tuple[str, str]]:
        """The keys this worker tunes, together with the others or alone."""
        return {r.key for r in (*self.plan.seeds, *self.plan.share)}


#: How long a stopped worker gets to exit on SIGTERM before it is killed. A worker in
#: a JAX job does not exit on SIGTERM: `jax.distributed` takes it as a preemption
#: notice. Its result file already holds all its keys (written atomically), so a kill
#: loses nothing; waiting 30 s for it cost the parent 30 s every time.
STOP_GRACE_S = 2.0


def _wait(workers: Sequence[_Worker], poll_s: float) -> None:
    """Waits for every worker. Once one has failed, the job cannot finish: each other
    worker is stopped as soon as its result file holds all its keys (it would only
    wait for the dead one), or once it exits on its own."""
    while True:
        running = [w for w in workers if w.proc.poll() is None]
        if not running:
            return
        if any(w.proc.returncode not in (None, 0) for w in workers if not w.stopped):
            for w in running:
                if w.keys <= _keys(load_result(w.out_path)):
                    w.stopped = True
                    w.proc.terminate()
                    try:
                        w.proc.wait(timeout=STOP_GRACE_S)
                    except subprocess.TimeoutExpired:
                        w.proc.kill()
                        w.proc.wait()
        time.sleep(poll_s)


def load_result(path: str) -> Any:
    """The `AutotuningResult` a worker wrote to `path`; None while it is missing or
    unreadable (a worker that died before its first key)."""
    from kerneltune._src.caching.result import AutotuningResult

    if not os.path.exists(path):
        return None
    try:
        return AutotuningResult.load(path)
    except ValueError:
        return None


def _keys(result: Any) -> set[tuple[str, str]]:
    """The (op id, call key) of each entry of `result` (none for None)."""
    return set() if result is None else {(e.op_id_v, e.call_key) for e in result}


def _free_port() -> int:
    """A TCP port free on this host now, for the job's coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
