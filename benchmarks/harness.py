"""What the GPU benchmarks share: device timing, random inputs, kerneltune executors,
and one results table, printed and written as JSON.

On a GPU a call's time is the summed device time of the kernels it launches, through
CUPTI (`jax.experimental.mosaic.gpu.profiler.measure`, as kerneltune's tuner does);
elsewhere, host wall time. Every figure is a median over many calls, and inputs that
fit in L2 are rotated so that no call reads what the previous ones left in cache.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
from kerneltune._src.caching.shipped import package_tables

L2_BYTES = 50 * 2**20  # an H100's and an H200's L2 cache
#: Host-time target of one timed session, and its bounds in calls.
SESSION_S = 0.2
MIN_CALLS, MAX_CALLS = 5, 100
SESSION_OUTPUT_BYTES = 8 * 2**30  # bounds the outputs, alive until a session ends


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


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

    _, per_call_ms = profiler.measure(_Cycle(fn, sets), iterations=calls)()
    if per_call_ms is None:
        raise RuntimeError("CUPTI recorded no kernel for this function")
    values = per_call_ms if isinstance(per_call_ms, list) else [per_call_ms]
    return [float(ms) / 1e3 for ms in values]


def _wall_calls(fn: Callable[..., Any], sets: Sequence[Any], calls: int) -> list[float]:
    out = []
    for i in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*sets[i % len(sets)]))
        out.append(time.perf_counter() - t0)
    return out


#: Timing rounds of `interleaved_times`: one session of every implementation per round.
ROUNDS = 3


def session(fn: Callable[..., Any], sets: Sequence[Any]) -> Callable[[], float]:
    """Compiles `fn` (jitted here unless it already is) and sizes a timing session;
    each call of the result runs one session and returns the median seconds per call,
    cycling through the argument sets; CUPTI device time on a GPU, else wall time."""
    fn = fn if hasattr(fn, "lower") else jax.jit(fn)
    out = jax.block_until_ready(fn(*sets[0]))  # compiles; not timed
    calls_of = _cupti_calls if on_gpu() else _wall_calls
    calls = round(SESSION_S / max(statistics.median(calls_of(fn, sets, 2)), 1e-7))
    calls = min(max(calls, MIN_CALLS), MAX_CALLS, max(2, SESSION_OUTPUT_BYTES // nbytes(out)))
    return lambda: statistics.median(calls_of(fn, sets, calls))


def device_time(fn: Callable[..., Any], sets: Sequence[Any]) -> float:
    """Median seconds per call of `fn` over one session (see `session`)."""
    return session(fn, sets)()


def interleaved_times(
    sessions: dict[str, Callable[[], float]], rounds: int = ROUNDS
) -> dict[str, float]:
    """Median over `rounds` rounds, each timing one session of every implementation
    (in a rotated order): clock and thermal drift hit every implementation alike, not
    whichever was timed last."""
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    names = list(sessions)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(sessions[name]())
    return {name: statistics.median(v) for name, v in samples.items()}


def copy_bandwidth(size_bytes: int) -> float:
    """Bytes per second (read + written) of one elementwise pass over a bf16 array of
    `size_bytes`: the device's practical memory bandwidth, measured in this run."""
    x = normal(0, (size_bytes // 2,))
    return 2 * size_bytes / device_time(lambda a: a + 1, [(x,)])


def heuristic_executor() -> kt.Executor:
    """Uses each kernel's heuristic config, tunes nothing, stores nothing."""
    policy = kt.AutotunePolicy(cache_miss_fallback="heuristics")
    return kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache(), policy=policy, persistent=None))


@dataclasses.dataclass
class Tuning:
    """An executor tuning every miss into a fresh cache directory; what it chose."""

    executor: kt.Executor
    chosen: list[tuple[str, Any]]


def tuning_executor(budget_s: float | None = None, *, shipped: bool = False) -> Tuning:
    """An executor that tunes every miss into a new, empty cache directory; with
    `shipped`, it also reads the tables shipped with kerneltune (exact hits, and warm
    starts near their shapes)."""
    chosen: list[tuple[str, Any]] = []

    def on_event(event: str, **data: Any) -> None:
        if event == "autotune_finish":
            chosen.append((data["op_id"], data.get("cfg")))

    cache: kt.PersistentCache[Any] = kt.PersistentCache(tempfile.mkdtemp(prefix="kt-bench-"))
    tuner: kt.Tuner[Any] | None = (
        kt.Tuner(progress=False, time_budget_s=budget_s) if budget_s else None
    )
    chain: kt.ConfigSelectorChain[Any, Any] = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        tuner=tuner,
        persistent=cache,
        on_event=on_event,
        shipped=package_tables() if shipped else None,
    )
    return Tuning(kt.Executor(chain), chosen)


def backend_of(chosen: Sequence[tuple[str, Any]]) -> str:
    """The backends the tuned configs name ("cudnn", "pallas+xla" for a forward and a
    backward that differ); "default" for a config type without a backend field."""
    names = [str(getattr(cfg, "backend", None) or "default") for _, cfg in chosen]
    return "+".join(dict.fromkeys(names)) or "-"


def error_text(e: BaseException) -> str:
    """`Type: first line of the message`, for a table cell or a log line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def timed_first_call(fn: Callable[..., Any], args: Sequence[Any]) -> float:
    """Wall seconds of `fn(*args)`'s first call: tracing, tuning, compiling, running."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


COLUMNS = ("plain", "cudnn", "tokamax", "kt_heuristic", "kt_tuned")
HEADER = "op pass shape plain cuDNN tokamax kt_heur kt_tuned backend tuned÷best %copy tune_s"
HEADER_CELLS = [c.replace("_", " ") for c in HEADER.split()]


@dataclasses.dataclass
class Row:
    """One op at one shape, or one block: seconds per call by column (None where it
    does not apply or failed: `errors` says which)."""

    op: str
    pass_: str
    shape: str
    times: dict[str, float | None] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(COLUMNS)
    )
    backend: str = "-"
    tune_s: float | None = None
    bytes_moved: int | None = None
    pct_copy: float | None = None
    first_call_s: dict[str, float] = dataclasses.field(default_factory=dict)
    note: str = ""
    errors: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def vs_best_other(self) -> float | None:
        """The best other implementation's time ÷ tuned time (> 1: tuned is faster)."""
        others = [t for k, t in self.times.items() if t and k not in ("kt_heuristic", "kt_tuned")]
        tuned = self.times.get("kt_tuned")
        return min(others) / tuned if others and tuned else None

    def as_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["pass"] = d.pop("pass_")
        d["tuned_vs_best_other"] = self.vs_best_other
        return d


def _us(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e6:.0f}" if t < 0.1 else f"{t * 1e3:.1f}ms"


def cells(r: Row) -> list[str]:
    ratio = r.vs_best_other
    out = [r.op, r.pass_, r.shape] + [_us(r.times.get(c)) for c in COLUMNS]
    out.append(r.backend)
    out.append("-" if ratio is None else f"{ratio:.2f}x")
    out.append("-" if r.pct_copy is None else f"{r.pct_copy:.0f}%")
    out.append("-" if r.tune_s is None else f"{r.tune_s:.1f}")
    return out


def table(rows: Sequence[Row]) -> str:
    """The results as one text table (times in µs unless marked ms)."""
    lines = [HEADER_CELLS] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER_CELLS))]
    text = [
        "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
        for line in lines
    ]
    text.insert(1, "-" * len(text[0]))
    notes = [f"  {r.op} {r.shape}: {r.note}" for r in rows if r.note]
    errors = [f"  {r.op} {r.pass_} {r.shape} {k}: {e}" for r in rows for k, e in r.errors.items()]
    return "\n".join(
        text + (["notes:", *notes] if notes else []) + (["errors:", *errors] if errors else [])
    )


def write_json(path: str, rows: Sequence[Row], **meta: Any) -> None:
    device = jax.devices()[0]
    doc = {
        "device": getattr(device, "device_kind", device.platform),
        "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "timer": "cupti" if on_gpu() else "wallclock",
        **meta,
        "rows": [r.as_json() for r in rows],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
