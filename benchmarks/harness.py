"""What the GPU benchmarks share: device timing and random inputs (the results table is
`results.py`; the implementations compared, `op_bench.py`).

On a GPU a call's time is the summed device time of the kernels it launches, through
CUPTI (`jax.experimental.mosaic.gpu.profiler.measure`, as kerneltune's tuner does);
elsewhere, host wall time. Every figure is a median over many calls, and inputs that
fit in L2 are rotated so that no call reads what the previous ones left in cache.
"""

from __future__ import annotations

import importlib
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

# The library's test, so that a benchmark and the kernels it times agree on what a GPU is.
from kerneltune.kernels._common import on_gpu as on_gpu

L2_BYTES = 50 * 2**20  # an H100's and an H200's L2 cache
#: Host-time target of one timed session, and its bounds in calls.
SESSION_S = 0.2
MIN_CALLS, MAX_CALLS = 5, 100
SESSION_OUTPUT_BYTES = 8 * 2**30  # bounds the outputs, alive until a session ends


def tokamax() -> Any:
    """The `tokamax` module where it is installed (as kerneltune's grouped matmul finds
    it), else None."""
    from kerneltune.kernels.ragged_dot import tokamax_backend

    return importlib.import_module("tokamax") if tokamax_backend.installed() else None


def normal(seed: int, shape: Sequence[int], dtype: Any = jnp.bfloat16) -> jax.Array:
    """Standard-normal data in `dtype` (random: timings of all-zero inputs flatter
    some kernels)."""
    return jax.random.normal(jax.random.key(seed), tuple(shape), jnp.float32).astype(dtype)


def nbytes(tree: Any) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def rotations(set_bytes: int) -> int:
    """How many argument sets to cycle through so that a set is out of L2 when it comes
    round again: 1 when one set is twice L2's size, up to 64 for tiny ones."""
    if set_bytes >= 2 * L2_BYTES:
        return 1
    return min(64, math.ceil(2 * L2_BYTES / max(set_bytes, 1)) + 1)


def arg_sets(make: Callable[[int], tuple[Any, ...]]) -> list[Any]:
    """`make(seed)` for as many seeds as `rotations` asks for (two on a CPU, where
    rotating only exercises the code)."""
    first = make(0)
    count = rotations(nbytes(first)) if on_gpu() else 2
    return [first] + [make(seed) for seed in range(1, count)]


class _Cycle:
    """Each call (with no arguments) runs `fn` on the next argument set. `measure`
    calls one function on one set of arguments, and jits whatever is not a
    `jax.stages.Wrapped`; this passes as one (it has `trace` and `lower`)."""

    def __init__(self, fn: Callable[..., Any], sets: Sequence[Any]) -> None:
        self.fn, self.sets, self.i = fn, sets, 0

    def __call__(self) -> Any:
        args = self.sets[self.i % len(self.sets)]
        self.i += 1
        return self.fn(*args)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("only called")

    lower = trace


def _cupti_calls(fn: Callable[..., Any], sets: Sequence[Any], calls: int) -> list[float]:
    from jax.experimental.mosaic.gpu import profiler

    cycle = _Cycle(fn, sets)
    try:
        _, per_call_ms = profiler.measure(cycle, iterations=calls)()
    except RuntimeError as e:
        if "not consistent" not in str(e):
            raise
        # A program whose kernels finish in a different order from call to call
        # (cuDNN's packed-layout backward, jax 0.11.2) cannot be split into calls by
        # kernel names, and measured one call at a time CUPTI saw a fraction of its
        # kernels (0.05 ms for a 3 ms step): it is timed on the wall clock instead.
        return _burst_calls(fn, sets, calls)
    if per_call_ms is None:
        raise RuntimeError("CUPTI recorded no kernel for this function")
    values = per_call_ms if isinstance(per_call_ms, list) else [per_call_ms]
    times = [float(ms) / 1e3 for ms in values]
    # Kernels in a consistent order can still escape CUPTI: cuDNN's packed-layout
    # backward read 0.05 ms in a 1-3 ms training step (jax 0.11.2, an H200).
    wall = burst_seconds(fn, sets, BURST)
    if wall > CUPTI_CHECK_S and statistics.median(times) < wall / 2:
        return _burst_calls(fn, sets, calls)
    return times


#: Wall seconds per call (in a burst) above which launch gaps cannot explain a CUPTI
#: time under half the wall: the call's device work is most of its wall.
CUPTI_CHECK_S = 3e-4


def _wall_calls(fn: Callable[..., Any], sets: Sequence[Any], calls: int) -> list[float]:
    out = []
    for i in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*sets[i % len(sets)]))
        out.append(time.perf_counter() - t0)
    return out


#: Calls per burst of `_burst_calls`.
BURST = 5


def burst_seconds(
    fn: Callable[..., Any], sets: Sequence[Any], calls: int, start: int = 0, in_flight: bool = True
) -> float:
    """Wall seconds per call of `calls` calls of `fn` back to back, cycling through the
    argument sets from `start`: device time plus the launch gaps, without one host
    round trip a call. With `in_flight` False each call is waited for before the next
    (XLA:CPU aborted with several collective programs in flight, jax 0.10.2)."""
    t0 = time.perf_counter()
    results = []
    for i in range(calls):
        results.append(fn(*sets[(start + i) % len(sets)]))
        if not in_flight:
            jax.block_until_ready(results[-1])
    jax.block_until_ready(results)
    return (time.perf_counter() - t0) / calls


def _burst_calls(fn: Callable[..., Any], sets: Sequence[Any], calls: int) -> list[float]:
    """Seconds per call of bursts of `BURST` calls (`burst_seconds`), one value a
    burst, about `calls` calls in all."""
    jax.block_until_ready(fn(*sets[0]))
    return [burst_seconds(fn, sets, BURST, b * BURST) for b in range(max(1, -(-calls // BURST)))]


def call_times(fn: Callable[..., Any], sets: Sequence[Any], calls: int) -> list[float]:
    """Seconds of each of `calls` calls of `fn`, cycling through the argument sets:
    CUPTI device time on a GPU, else host wall time."""
    return (_cupti_calls if on_gpu() else _wall_calls)(fn, sets, calls)


#: Timing rounds of `interleaved_times`: one session of every implementation per round.
ROUNDS = 9


def session(fn: Callable[..., Any], sets: Sequence[Any]) -> Callable[[], float]:
    """Compiles `fn` (jitted here unless it already is, or is a compiled program,
    `jax.stages.Compiled`, which `jax.clear_caches` leaves compiled) and sizes a timing
    session; each call of the result runs one session and returns the median seconds
    per call, cycling through the argument sets; CUPTI device time on a GPU, else wall
    time."""
    fn = fn if hasattr(fn, "lower") or isinstance(fn, jax.stages.Compiled) else jax.jit(fn)
    out = jax.block_until_ready(fn(*sets[0]))  # compiles; not timed
    calls = session_calls(statistics.median(call_times(fn, sets, 2)), nbytes(out))
    return lambda: statistics.median(call_times(fn, sets, calls))


def session_calls(call_s: float, out_bytes: int) -> int:
    """Calls in one timing session of a function taking `call_s` a call: about
    `SESSION_S` of them, within `MIN_CALLS` and `MAX_CALLS`, and no more than keep
    `SESSION_OUTPUT_BYTES` of outputs alive (every call's outputs live until the session
    ends: 2 GiB of logits a call would fill the device in 40 calls)."""
    calls = min(max(round(SESSION_S / max(call_s, 1e-7)), MIN_CALLS), MAX_CALLS)
    return min(calls, max(2, SESSION_OUTPUT_BYTES // max(out_bytes, 1)))


def device_time(fn: Callable[..., Any], sets: Sequence[Any]) -> float:
    """Median seconds per call of `fn` over one session (see `session`)."""
    return session(fn, sets)()


def interleaved_times(
    sessions: dict[str, Callable[[], float]], rounds: int | None = None
) -> dict[str, float]:
    """Median over `rounds` rounds (default `ROUNDS`), each timing one session of every
    implementation (in a rotated order): clock and thermal drift hit every
    implementation alike, not whichever was timed last."""
    rounds = ROUNDS if rounds is None else rounds
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    names = list(sessions)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(sessions[name]())
    return {name: statistics.median(v) for name, v in samples.items()}


def program_text(fn: Callable[..., Any], args: Sequence[Any]) -> str:
    """`fn`'s optimised HLO for `args`, without what differs between two compilations
    of one program (source locations, instruction numbering, the module's name,
    kerneltune's labels): equal texts run the same kernels, so their timings differ
    only by noise."""
    fn = fn if hasattr(fn, "lower") else jax.jit(fn)
    text = fn.lower(*args).compile().as_text()
    starts = [i for i in (text.find("\n%"), text.find("\nENTRY")) if i >= 0]
    text = text[min(starts, default=0) :]  # the computations, not the header
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    # kerneltune's label on an instruction (`KERNELTUNE_STAMP`) changes no kernel.
    text = re.sub(r',?kerneltune_label="[^"]*"', "", text).replace(", frontend_attributes={}", "")
    text = text.replace("frontend_attributes={,", "frontend_attributes={")
    return re.sub(r"(%?[A-Za-z_][\w-]*)\.\d+\b", r"\1", text)  # names, not numbers


def same_program_as(
    fns: dict[str, Callable[..., Any]], name: str, args: Sequence[Any]
) -> list[str]:
    """The implementations in `fns` that compile to the same program as `fns[name]`."""
    try:
        texts = {k: program_text(f, args) for k, f in fns.items()}
    except Exception:  # an implementation that does not lower has no program to share
        return []
    return [k for k, t in texts.items() if k != name and t == texts[name]]


def copy_bandwidth(size_bytes: int) -> float:
    """Bytes per second (read + written) of one elementwise pass over a bf16 array of
    `size_bytes`: the device's practical memory bandwidth, measured in this run."""
    x = normal(0, (size_bytes // 2,))
    return 2 * size_bytes / device_time(lambda a: a + 1, [(x,)])


def error_text(e: BaseException) -> str:
    """`Type: first line of the message`, for a table cell or a log line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def timed_first_call(fn: Callable[..., Any], args: Sequence[Any]) -> float:
    """Wall seconds of `fn(*args)`'s first call: tracing, tuning, compiling, running."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0
