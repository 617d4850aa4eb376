"""Building candidates in parallel: a lowering lane feeding a lane of compile threads.

Building a candidate has two stages that need different things:

1. tracing and lowering (`jax.jit(f).lower(...)`, which calls the user's `make_fn`):
   Python that holds the GIL (a Pallas kernel is traced and lowered to Triton IR in
   Python), about 10-20 ms for a Pallas matmul;
2. compiling (`lowered.compile()`): XLA and Triton in C++, which release the GIL,
   10-20 times longer.

When every thread does both, the threads share the GIL in 5 ms slices: each lowering
takes as long as all the lowerings in flight together, compiles start late and bunched,
and the phase ends with whichever slow compiles happened to start last. Here one thread
lowers candidates one at a time, in priority order (the caller puts the slowest to
compile first, so no long compile starts last), and hands each one to the compile lane.
A lowering that stalls without using the GIL (a `make_fn` waiting on I/O, say) gets a
helper thread, so the other candidates keep coming; the helper leaves when the stall is
over. JAX's tracing itself still runs one at a time (`programs.lower_alone`): two
threads tracing at once crashed the process.

A thread cannot be killed: a stage that outlasts the timeout is abandoned (its result is
ignored when it finally arrives) and a replacement thread takes over the lane's queue.
Threads are daemons, so an abandoned compile never blocks the caller; interpreter exit
waits for the stages still running (`stages.exit_waits_for_this`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import heapq
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from kerneltune._src.tuning.stages import exit_waits_for_this

#: Stages: tracing and lowering, then compiling.
LOWER, COMPILE = 0, 1


@dataclasses.dataclass(frozen=True)
class CompileOutcome:
    """One finished (or abandoned) job.

    Attributes:
      key: the key the job was submitted with.
      value: what the job returned (None when it failed or timed out).
      error: the exception it raised, if any.
      timed_out: a stage ran past the timeout and was abandoned.
      seconds: how long its stages ran (up to the timeout for abandoned jobs).
      lower_s: how long its first stage ran (None when it never finished).
    """

    key: Hashable
    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    seconds: float = 0.0
    lower_s: float | None = None


def default_workers() -> int:
    """Threads for compiling: the cores this process may use."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores)


@dataclasses.dataclass(order=True)
class _Item:
    priority: float
    seq: int
    key: Hashable = dataclasses.field(compare=False)
    job: Callable[[], Any] = dataclasses.field(compare=False)
    then: Callable[[Any], Any] | None = dataclasses.field(compare=False)
    ctx: contextvars.Context = dataclasses.field(compare=False)
    lower_s: float | None = dataclasses.field(compare=False, default=None)


@dataclasses.dataclass
class _Running:
    item: _Item
    stage: int
    start: float | None = None  # None while waiting to start (`others_paused`)


class CompilePool:
    """Runs two-stage jobs on daemon threads; `poll` returns finished and timed-out jobs.

    A job is `first` (run on the lowering lane) and optionally `then` (run on the
    compile lane with `first`'s result). Each lane takes the job of lowest `priority`
    first (ties: the earlier). Jobs run in a copy of the submitting thread's context
    (contextvars), so scoped settings such as kerneltune overlays apply inside them.

    Args:
      max_workers: compile threads.
      timeout_s: a stage running longer than this is abandoned (None: never).
      lowering_workers: threads that run first stages (more only while one stalls).
      stall_s: a first stage running this long without finishing gets a helper thread
        for the rest of the queue (None: never).
    """

    def __init__(
        self,
        max_workers: int,
        timeout_s: float | None,
        *,
        lowering_workers: int = 1,
        stall_s: float | None = 0.25,
    ) -> None:
        self._timeout_s = timeout_s
        self._stall_s = stall_s
        self._lock = threading.Lock()
        self._wake = (threading.Condition(self._lock), threading.Condition(self._lock))
        self._queues: tuple[list[_Item], list[_Item]] = ([], [])
        self._base = (max(1, lowering_workers), max(1, max_workers))
        self._most = (max(self._base[0], max_workers), self._base[1])
        self._live = [0, 0]
        self._idle = [0, 0]
        self._running: dict[Hashable, _Running] = {}
        self._abandoned: dict[Hashable, int] = {}  # key -> the stage that was abandoned
        self._done: queue.SimpleQueue[CompileOutcome] = queue.SimpleQueue()
        self._seq = itertools.count()
        self._pending = 0
        self._closed = False

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet returned by `poll` (nor cancelled)."""
        return self._pending

    def submit(
        self,
        key: Hashable,
        first: Callable[[], Any],
        then: Callable[[Any], Any] | None = None,
        *,
        priority: float = 0.0,
    ) -> None:
        item = _Item(priority, next(self._seq), key, first, then, contextvars.copy_context())
        with self._lock:
            self._pending += 1
            self._push(LOWER, item)

    def reprioritize(self, priority: Callable[[Hashable], float | None]) -> None:
        """Gives queued jobs new priorities (`priority(key)`; None keeps the old one)."""
        with self._lock:
            for q in self._queues:
                for item in q:
                    new = priority(item.key)
                    if new is not None:
                        item.priority = new
                heapq.heapify(q)

    def cancel(self, key: Hashable) -> bool:
        """Forgets a job: it is taken out of its queue, or abandoned if it is running.
        Returns False when it already finished (its outcome is or was in `poll`)."""
        with self._lock:
            for q in self._queues:
                for n, item in enumerate(q):
                    if item.key == key:
                        q.pop(n)
                        heapq.heapify(q)
                        self._pending -= 1
                        return True
            run = self._running.pop(key, None)
            if run is None:
                return False
            self._abandon(key, run.stage)
            self._pending -= 1
            return True

    def queued(self) -> list[Hashable]:
        """The jobs waiting in either lane's queue: none of their stages is running."""
        with self._lock:
            return [item.key for q in self._queues for item in q]

    # --- the lanes ---------------------------------------------------------------------

    def _push(self, stage: int, item: _Item) -> None:
        heapq.heappush(self._queues[stage], item)
        if self._live[stage] < self._base[stage]:
            self._start(stage)
        else:
            self._wake[stage].notify()

    def _start(self, stage: int) -> None:
        self._live[stage] += 1
        name = ("kerneltune-lower", "kerneltune-compile")[stage]
        threading.Thread(target=self._work, args=(stage,), name=name, daemon=True).start()

    def _abandon(self, key: Hashable, stage: int) -> None:
        # Lock held. The thread running it leaves when it returns; if work is waiting,
        # a replacement takes its place now.
        self._abandoned[key] = stage
        self._live[stage] -= 1
        if self._queues[stage] and self._live[stage] < self._base[stage]:
            self._start(stage)

    def _work(self, stage: int) -> None:
        while True:
            with self._lock:
                while not self._queues[stage] and not self._closed:
                    self._idle[stage] += 1
                    self._wake[stage].wait()
                    self._idle[stage] -= 1
                if self._closed:
                    self._live[stage] -= 1
                    return
                item = heapq.heappop(self._queues[stage])
                self._running[item.key] = _Running(item, stage)
            # Counted as running until the result is handed over and this thread holds
            # no reference to it: exit waits for that (see `wait_for_running_stages`).
            with exit_waits_for_this():
                try:
                    leave = self._admit_and_run(item, stage)
                finally:
                    # The last reference to the job (its inputs, its lowering) may be
                    # this one: freeing XLA objects must happen inside the stage, never
                    # in a daemon thread racing interpreter exit (SIGABRT on JAX 0.12).
                    del item
            if leave:
                return

    def _admit_and_run(self, item: _Item, stage: int) -> bool:
        """Runs `item`'s stage unless it was abandoned while waiting to start; True
        when this thread should leave its lane."""
        # Entering the stage may have waited while a CUPTI session paused other threads
        # (`others_paused`): the job's time (its timeout, a stalled lane) counts from
        # now, not from the pop; a job abandoned meanwhile is not run.
        with self._lock:
            if self._abandoned.get(item.key) == stage:
                del self._abandoned[item.key]
                return True  # already counted out of the lane; a replacement took over
            running = self._running.get(item.key)
            if running is not None:
                running.start = time.perf_counter()
        return self._run_one(item, stage)

    def _run_one(self, item: _Item, stage: int) -> bool:
        """Runs one stage of `item` and hands its result on; True when this thread
        should leave its lane."""
        start = time.perf_counter()
        try:
            value, error = item.ctx.run(item.job), None
        except BaseException as e:  # reported to the caller as data.
            value, error = None, e
        try:
            return self._hand_on(item, stage, value, error, time.perf_counter() - start)
        finally:
            # An error's traceback holds this frame, and so `item`: without these the
            # job would live on in a reference cycle that any thread's collection may
            # free, after exit stopped waiting.
            del value, error

    def _hand_on(
        self, item: _Item, stage: int, value: Any, error: BaseException | None, seconds: float
    ) -> bool:
        """Passes a finished stage's result to the next stage or to `poll`; True when
        this thread should leave its lane."""
        with self._lock:
            if self._abandoned.get(item.key) == stage:
                del self._abandoned[item.key]
                return True  # already counted out of the lane; a replacement took over
            self._running.pop(item.key, None)
            if self._closed:
                # Nobody polls any more: dropped here, inside the stage, not later with
                # the pool on whichever thread lets go of it last.
                return False
            if stage == LOWER and error is None and item.then is not None:
                self._push(
                    COMPILE,
                    dataclasses.replace(
                        item,
                        seq=next(self._seq),
                        job=functools.partial(item.then, value),
                        then=None,
                        ctx=item.ctx.copy(),
                        lower_s=seconds,
                    ),
                )
            else:
                lower_s = seconds if stage == LOWER else item.lower_s
                total = seconds + (item.lower_s or 0.0)
                self._done.put(
                    CompileOutcome(item.key, value, error, seconds=total, lower_s=lower_s)
                )
            if self._live[stage] > self._base[stage] and not self._stalled(time.perf_counter()):
                self._live[stage] -= 1  # a helper whose stall is over
                return True
        return False

    def _stalled(self, now: float) -> bool:
        """Lock held: every lowering thread is busy and has been on its job for longer
        than `stall_s`."""
        if self._stall_s is None:
            return False
        busy = [r for r in self._running.values() if r.stage == LOWER]
        return (
            bool(busy)
            and len(busy) >= self._live[LOWER]
            and all(r.start is not None and now - r.start > self._stall_s for r in busy)
        )

    # --- the caller's side -------------------------------------------------------------

    def poll(self, wait_s: float) -> list[CompileOutcome]:
        """Waits up to `wait_s` for at least one job to finish and returns every job
        that finished or timed out since the last call."""
        out: list[CompileOutcome] = []
        try:
            out.append(self._done.get(timeout=wait_s if self._pending and wait_s > 0 else 0))
        except queue.Empty:
            pass
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        out += self._supervise()
        with self._lock:
            self._pending -= len(out)
        return out

    def _supervise(self) -> list[CompileOutcome]:
        """Abandons stages past the timeout; gives a stalled lowering lane a helper."""
        now = time.perf_counter()
        expired = []
        with self._lock:
            if self._timeout_s is not None:
                for key, run in list(self._running.items()):
                    if run.start is not None and now - run.start > self._timeout_s:
                        del self._running[key]
                        self._abandon(key, run.stage)
                        seconds = now - run.start + (run.item.lower_s or 0.0)
                        expired.append(CompileOutcome(key, timed_out=True, seconds=seconds))
            if self._queues[LOWER] and self._live[LOWER] < self._most[LOWER] and self._stalled(now):
                self._start(LOWER)
        return expired

    def close(self) -> None:
        """Drops queued jobs and lets idle threads exit; running stages run on until
        they return (their results are dropped)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for q in self._queues:
                q.clear()
            for cv in self._wake:
                cv.notify_all()
