"""Lowering a tuning's candidates in worker processes, side by side.

Lowering a Pallas candidate is Python work (tracing, building Mosaic's or Triton's IR):
it holds Python's lock and takes turns with every other lowering of this process
(`programs.lower_alone`), while compiles overlap on threads. On an H200 a Mosaic
grouped-matmul config lowered in 0.35 s, one after another, and a full search of an
MoE layer lowers about 60 of them. Worker processes (`lowering_worker.py`) lower
candidates side by side and send each back exported (`jax.export`); this process loads
the export (0.04 s: nothing of the kernel is traced again) and compiles it as it
compiles its own lowerings. `benchmarks/candidate_builds_gpu.py` measures the ways.

A worker gets what the tuner builds a program from: `make_fn` itself (pickled: a
module-level function or object, such as `dispatch.KernelFunction`), the config, and
the arguments with their arrays as `ShapeDtypeStruct`s. What cannot go that way is
lowered here, as without workers: a `make_fn` or a constant argument that does not
pickle, arrays on several devices, a program with its backward (a training
candidate's backward calls the gradient kernels, whose configs this process
chooses), a program the worker could not export or whose kernels choose a config, and
every candidate until a worker has started. The tuner validates every candidate's
output against the reference either way.

`KERNELTUNE_LOWERING_WORKERS` sets how many workers run: 0 (the default) none, `auto` 4
on a CUDA GPU when this process may use at least 8 CPU cores. They start with
`kt.autotune` and `kerneltune tune`, or at the first search of at least
`MIN_CANDIDATES` candidates, serve the process's later searches, and end with it. Each
holds a CUDA context on the GPU (no preallocation).

Off by default until a GPU shows them paying: alone they did not shorten an MoE layer's
`kt.autotune` on an H200 (40.6 / 36.2 s against 35.6-38.6 s, BENCHMARKS.md), whose
searches then took two or three batches of a few candidates a key, each batch waiting
on its compiles. A warm search now spends a budget no wider than the compile threads in
one batch (`warm_start.py`), 12 Mosaic candidates a key, whose lowerings are what the
workers take side by side.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import importlib.util
import logging
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jax

from kerneltune._src.core import options
from kerneltune._src.tuning import lowering_worker, programs
from kerneltune._src.tuning.compiling import default_workers

logger = logging.getLogger("kerneltune")

#: Searches of fewer candidates are lowered here, so that a first call's shortlist (the
#: heuristic and 3 predicted configs) never starts workers in the middle of a step.
MIN_CANDIDATES = 6
#: Workers by default on a CUDA GPU, given at least `DEFAULT_MIN_CORES` cores.
DEFAULT_WORKERS = 4
DEFAULT_MIN_CORES = 8
#: The JAX flags a worker lowers under, sent with every request.
JAX_FLAGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_numpy_dtype_promotion")
#: How long a worker may take to start (import JAX, open its backend).
START_TIMEOUT_S = 120.0

#: How this process's candidates were lowered: "worker", or "here: <why>".
lowered_by: Counter[str] = Counter()
_counting = threading.Lock()


def _count(way: str) -> None:
    with _counting:  # compile threads lower side by side
        lowered_by[way] += 1


def configured_workers() -> int:
    """How many lowering workers this process runs (`KERNELTUNE_LOWERING_WORKERS`;
    none in a worker itself, nor without the `flatbuffers` package jax.export needs).

    Raises:
      ValueError: the variable holds neither a whole number of 0 or more nor "auto".
    """
    if lowering_worker.in_worker():
        return 0
    count = options.LOWERING_WORKERS.value
    if count is None:
        gpu = jax.default_backend() == "gpu"
        count = DEFAULT_WORKERS if gpu and default_workers() >= DEFAULT_MIN_CORES else 0
    if count and importlib.util.find_spec("flatbuffers") is None:
        logger.info("lowering workers: jax.export needs the flatbuffers package; lowering here")
        return 0
    return count


class WorkerDied(RuntimeError):
    """A worker ended (or was stopped) before it answered."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(self) -> None:
        env = {
            **os.environ,
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            # It imports what this process imports, from where this process does.
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from kerneltune._src.tuning import lowering_worker as w; w.main()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
        )

    def receive(self, timeout_s: float) -> Any:
        """The worker's next message; `WorkerDied` when it ends or takes `timeout_s`."""
        assert self.proc.stdout is not None
        watchdog = threading.Timer(timeout_s, self.proc.kill)
        watchdog.start()
        try:
            blob = lowering_worker.receive_bytes(self.proc.stdout)  # type: ignore[arg-type]
        finally:
            watchdog.cancel()
        if blob is None:
            self.proc.kill()
            raise WorkerDied(f"a lowering worker ended ({self._why()})")
        return pickle.loads(blob)

    def ask(self, request: bytes, timeout_s: float) -> Any:
        assert self.proc.stdin is not None
        try:
            lowering_worker.send_bytes(self.proc.stdin, request)  # type: ignore[arg-type]
        except OSError as e:
            raise WorkerDied(f"a lowering worker ended ({self._why()})") from e
        return self.receive(timeout_s)

    def _why(self) -> str:
        try:
            code: int | None = self.proc.wait(timeout=2)  # its output ended: it is ending
        except subprocess.TimeoutExpired:
            code = None
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace").strip().splitlines()[-2:]
        return f"exit code {code}" + (f": {' | '.join(tail)}" if tail else "")

    def close(self) -> None:
        """Ends the worker (closing its input ends its loop) and closes the pipes."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


class LoweringPool:
    """`count` workers, each served by a thread of this process that starts it and
    hands it one request at a time."""

    def __init__(self, count: int) -> None:
        self._tasks: queue.Queue[tuple[bytes, concurrent.futures.Future[Any]] | None] = (
            queue.Queue()
        )
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._starting = count
        self.failure: str | None = None
        self._threads = [
            threading.Thread(target=self._serve, name=f"kerneltune-lowering-{i}", daemon=True)
            for i in range(count)
        ]
        for t in self._threads:
            t.start()

    @property
    def ready(self) -> bool:
        """Whether a worker has started (requests wait for one until then)."""
        return self._ready.is_set()

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Waits until a worker has started or every one failed to; whether one did."""
        while not self._ready.wait(0.05):
            timeout_s -= 0.05
            with self._lock:
                if self._starting == 0 or timeout_s <= 0:
                    return False
        return True

    def submit(self, request: bytes) -> concurrent.futures.Future[Any]:
        """The reply to a pickled request, when a worker has answered it."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._tasks.put((request, future))
        return future

    def _start(self) -> _Worker | None:
        worker = _Worker()
        try:
            hello = worker.receive(START_TIMEOUT_S)
        except WorkerDied as e:
            self.failure = str(e)
            worker.close()
            return None
        expected = ("ready", jax.__version__, jax.default_backend())
        if tuple(hello) != expected:
            self.failure = f"a lowering worker runs {hello[1:]}, this process {expected[1:]}"
            worker.close()
            return None
        return worker

    def _serve(self) -> None:
        worker = self._start()
        with self._lock:
            self._starting -= 1
        if worker is None:
            return
        self._ready.set()
        while (task := self._tasks.get()) is not None:
            request, future = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(worker.ask(request, programs.LOWERING_WAIT_S))
            except WorkerDied as e:
                future.set_exception(e)
                worker.close()
                worker = self._start()  # the next request gets a fresh worker
                if worker is None:
                    return
        worker.close()

    def close(self) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        for t in self._threads:
            t.join(timeout=10)


_pool: LoweringPool | None = None
_pool_lock = threading.Lock()


def shared_pool(count: int) -> LoweringPool:
    """This process's pool (started on first use, stopped at exit)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = LoweringPool(count)
            atexit.register(_pool.close)
        return _pool


def start_early() -> None:
    """Starts this process's workers now, when it runs any, so that they are up when
    a search needs them (`kt.autotune` traces the whole function first)."""
    count = configured_workers()
    if count:
        shared_pool(count)


def _specs(arrays: Sequence[Any], rebuild: Callable[..., Any]) -> Any:
    """The tuning's arguments with `ShapeDtypeStruct`s for its arrays."""
    return rebuild(
        [
            jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
            for a in arrays
        ]
    )


def _one_device(arrays: Sequence[Any]) -> bool:
    return all(len(getattr(getattr(a, "sharding", None), "device_set", ())) <= 1 for a in arrays)


def lowering(
    make_fn: Callable[[Any], Callable[..., Any]],
    rebuild: Callable[..., Any],
    arrays: Sequence[Any],
    *,
    backward: bool,
    candidates: int,
) -> Callable[[Any], Any]:
    """The first build stage of a config, as `programs.lowering`'s, lowered by a
    worker where one can (see the module's docstring)."""
    here = programs.lowering(make_fn, rebuild, arrays, backward=backward)
    count = configured_workers()
    if count == 0 or backward or candidates < MIN_CANDIDATES or not _one_device(arrays):
        return here
    try:  # once a search: every request carries these bytes
        recipe = pickle.dumps((make_fn, _specs(arrays, rebuild), backward))
    except Exception as e:  # a closure, a lambda, a constant that does not pickle
        logger.debug("lowering candidates here: %s does not pickle (%s)", make_fn, e)
        why = f"here: the program does not pickle ({type(e).__name__})"

        def pickle_failed(cfg: Any) -> Any:
            _count(why)
            return here(cfg)

        return pickle_failed
    pool = shared_pool(count)

    def lower(cfg: Any) -> Any:
        if not pool.ready:
            _count("here: no worker has started")
            return here(cfg)
        flags = {name: getattr(jax.config, name) for name in JAX_FLAGS if hasattr(jax.config, name)}
        try:
            request = pickle.dumps((recipe, cfg, flags))
        except Exception:  # this config does not pickle
            _count("here: the config does not pickle")
            return here(cfg)
        try:
            status, value = pool.submit(request).result()
        except WorkerDied as e:
            status, value = "error", str(e)
        if status != "ok":
            logger.debug("a lowering worker did not lower %s: %s", cfg, value)
            _count(f"here: {value.splitlines()[0][:80]}")
            return here(cfg)
        _count("worker")
        exported = jax.export.deserialize(bytearray(value))
        return programs.lower_alone(exported.call, arrays)

    return lower


__all__ = [
    "LoweringPool",
    "configured_workers",
    "lowering",
    "lowered_by",
    "shared_pool",
    "start_early",
]
