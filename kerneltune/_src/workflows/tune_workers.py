"""`kerneltune tune --workers N`: one worker process per local GPU, keys dealt by cost.

The parent never starts JAX: a JAX process that touched a GPU holds most of its memory,
which would starve the workers. It deals the manifest's records to the workers by
estimated cost (longest first, each to the least loaded worker), starts one
`kerneltune tune` per worker on its own GPU (`CUDA_VISIBLE_DEVICES`), and merges what
they wrote. A worker rewrites its result file after every key, so a worker that dies
loses only the keys it had not finished; the parent names them and exits with 1.

On a machine without GPUs the workers are plain processes (e.g. to tune several CPU
shapes at once, or to test this module).
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import subprocess
import sys
import tempfile
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
    """What one worker was given and what came back."""

    index: int
    gpu: str | None
    assigned: tuple[Any, ...]
    returncode: int
    finished: frozenset[tuple[str, str]]
    log: str

    @property
    def unfinished(self) -> list[Any]:
        """Assigned records with no result (the worker died before them, or they
        failed or could not be tuned)."""
        return [r for r in self.assigned if (r.op_id_v, r.call_key) not in self.finished]


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
    count: int,
    command: WorkerCommand,
    *,
    gpus: Sequence[str] = (),
) -> tuple[Any, list[WorkerRun]]:
    """Tunes `records` in `count` worker processes and merges their results.

    Returns:
      `(result, runs)`: the merged `AutotuningResult` (None when no worker finished a
      key) and one `WorkerRun` per worker.
    """
    from kerneltune._src.caching.result import AutotuningResult

    parts = deal_by_cost(records, count)
    with tempfile.TemporaryDirectory(prefix="kerneltune-workers-") as tmp:
        procs = []
        for i, part in enumerate(parts):
            keys_path = os.path.join(tmp, f"keys{i}.json")
            out_path = os.path.join(tmp, f"result{i}.json")
            log_path = os.path.join(tmp, f"log{i}.txt")
            write_keys(keys_path, part)
            argv = command.argv(keys_path, out_path)
            env = dict(os.environ)
            gpu = gpus[i] if i < len(gpus) else None
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
            log = open(log_path, "w")  # closed once the process ends
            procs.append((i, gpu, part, out_path, log_path, log, subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT
            )))  # fmt: skip
        runs, results = [], []
        for i, gpu, part, out_path, log_path, log, proc in procs:
            code = proc.wait()
            log.close()
            finished: frozenset[tuple[str, str]] = frozenset()
            if os.path.exists(out_path):
                try:
                    result = AutotuningResult.load(out_path)
                except ValueError:
                    result = None
                if result is not None:
                    results.append(result)
                    finished = frozenset((e.op_id_v, e.call_key) for e in result)
            with open(log_path, errors="replace") as f:
                text = f.read()
            runs.append(WorkerRun(i, gpu, tuple(part), code, finished, text))
    merged = None
    for result in results:
        merged = result if merged is None else merged | result
    return merged, runs
