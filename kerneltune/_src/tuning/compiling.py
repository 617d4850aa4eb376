"""Parallel compilation of candidates, with a per-candidate timeout.

XLA and Triton compile in C++ without holding the GIL, so threads give real
parallelism. A thread cannot be killed: a candidate whose compile outlasts the timeout
is abandoned (its result is ignored when it finally arrives) and a replacement worker is
started so the others keep their pace. Workers are daemon threads, so an abandoned
compile never keeps the interpreter from exiting (a `ThreadPoolExecutor` would join it
at exit).
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One finished (or abandoned) job.

    Attributes:
      key: the key the job was submitted with.
      value: what the job returned (None when it failed or timed out).
      error: the exception it raised, if any.
      timed_out: it ran past the timeout and was abandoned.
      seconds: how long it ran (up to the timeout for abandoned jobs).
    """

    key: Hashable
    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    seconds: float = 0.0


def default_workers() -> int:
    """Threads for compiling: the cores this process may use."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores)


class CompilePool:
    """Runs jobs on daemon threads; `poll` returns finished and timed-out jobs.

    Jobs run in a copy of the submitting thread's context (contextvars), so scoped
    settings such as kerneltune overlays apply inside them.
    """

    def __init__(self, max_workers: int, timeout_s: float | None) -> None:
        self._max_workers = max(1, max_workers)
        self._timeout_s = timeout_s
        self._jobs: queue.SimpleQueue[tuple[Hashable, Callable[[], Any], Any] | None] = (
            queue.SimpleQueue()
        )
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: dict[Hashable, tuple[float, threading.Thread]] = {}
        self._abandoned: set[Hashable] = set()
        self._workers = 0
        self._pending = 0
        self._closed = False

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet returned by `poll`."""
        return self._pending

    def submit(self, key: Hashable, job: Callable[[], Any]) -> None:
        ctx = contextvars.copy_context()
        with self._lock:
            self._pending += 1
            if self._workers < min(self._max_workers, self._pending):
                self._start_worker()
        self._jobs.put((key, job, ctx))

    def _start_worker(self) -> None:
        self._workers += 1
        threading.Thread(target=self._work, name="kerneltune-compile", daemon=True).start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._jobs.get()
            if item is None:
                return
            key, job, ctx = item
            start = time.perf_counter()
            with self._lock:
                self._running[key] = (start, me)
            try:
                outcome = Outcome(key, value=ctx.run(job))
            except BaseException as e:  # reported to the caller as data.
                outcome = Outcome(key, error=e)
            seconds = time.perf_counter() - start
            with self._lock:
                self._running.pop(key, None)
                if key in self._abandoned:
                    # Its replacement already took over; this thread just leaves.
                    self._abandoned.discard(key)
                    return
            self._done.put(dataclasses.replace(outcome, seconds=seconds))

    def poll(self, wait_s: float) -> list[Outcome]:
        """Waits up to `wait_s` for at least one job to finish and returns every job
        that finished or timed out since the last call."""
        out: list[Outcome] = []
        try:
            out.append(self._done.get(timeout=wait_s if self._pending else 0))
        except queue.Empty:
            pass
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        out += self._expire()
        self._pending -= len(out)
        return out

    def _expire(self) -> list[Outcome]:
        if self._timeout_s is None:
            return []
        now = time.perf_counter()
        expired = []
        with self._lock:
            for key, (start, _) in list(self._running.items()):
                if now - start > self._timeout_s:
                    del self._running[key]
                    self._abandoned.add(key)
                    self._workers -= 1
                    expired.append(Outcome(key, timed_out=True, seconds=now - start))
                    if self._jobs.qsize():
                        self._start_worker()
        return expired

    def close(self) -> None:
        """Lets idle workers exit; abandoned jobs run on until they return."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            workers = self._workers
        for _ in range(workers):
            self._jobs.put(None)
