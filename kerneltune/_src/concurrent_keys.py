"""Tuning several keys at once: one family of calls per thread.

On a GPU timed by CUPTI, while one key's candidates are timed (the device is timed by
one thread at a time: `sampler.DEVICE_LOCK`) or its search waits for results, another
key's candidates can compile. But the calls of one *family* (same op, dtypes and static
values; `call_shapes.py`) are tuned in turn: the first starts cold and the next ones
warm-start from it, while tuned at once they would all start cold.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import queue
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from kerneltune._src import devices
from kerneltune._src.tuning import journal

#: Families of keys tuned at once on a GPU.
KEY_THREADS_GPU = 3


class _Keyed(Protocol):
    @property
    def op_id_v(self) -> str: ...

    @property
    def call_key(self) -> str: ...

    @property
    def shape(self) -> Any: ...


R = TypeVar("R", bound=_Keyed)
Out = TypeVar("Out")


def key_threads(tuner: Any, count: int) -> int:
    """How many families of keys to tune at once: several on a GPU timed by CUPTI
    (compiles on the host do not disturb device time), one elsewhere (they would
    disturb wall-clock time) and in a journaling isolated worker (its journal follows
    one key at a time)."""
    timer = getattr(tuner, "timer", None)
    if count < 2 or journal.enabled() or timer not in ("auto", "cupti"):
        return 1
    return min(KEY_THREADS_GPU, count) if devices.get_device_platform() == "triton" else 1


def tune_families_at_once(
    records: Sequence[R],
    tune_one: Callable[[R], Out],
    threads: int,
    landed: Callable[[R, Out], None],
    failed: Callable[[R, BaseException], Out],
) -> list[Out]:
    """`tune_one` of every record, the families `threads` at a time and each family's
    records in turn; `landed(record, outcome)` in this thread as each one lands.
    Returns the outcomes in the records' order. When `tune_one` raises, that record and
    the rest of its family get `failed(record, error)` and the error is raised once
    every family has finished."""
    families: dict[tuple[str, Any], list[int]] = {}
    for i, r in enumerate(records):
        family = r.shape.family if r.shape is not None else r.call_key
        families.setdefault((r.op_id_v, family), []).append(i)
    done: queue.Queue[tuple[int, Out]] = queue.Queue()

    def tune_family(indices: list[int]) -> None:
        for n, i in enumerate(indices):
            try:
                outcome = tune_one(records[i])
            except BaseException as e:
                for j in indices[n:]:
                    done.put((j, failed(records[j], e)))
                raise
            done.put((i, outcome))

    outcomes: dict[int, Out] = {}
    with concurrent.futures.ThreadPoolExecutor(threads, "kerneltune-key") as pool:
        # Each family runs in a copy of the caller's context (scopes, policies and
        # `distributed.tuning_alone` are context variables).
        futures = [
            pool.submit(contextvars.copy_context().run, tune_family, indices)
            for indices in families.values()
        ]
        while len(outcomes) < len(records):
            i, outcome = done.get()
            outcomes[i] = outcome
            landed(records[i], outcome)
        for f in futures:
            f.result()
    return [outcomes[i] for i in range(len(records))]
