"""`kerneltune demo`: tune the bundled kernels on this device, show what tuning bought,
fill the persistent cache, then make the same calls again and show they came from it.

On a GPU it tunes the Pallas kernels on realistic shapes. On a CPU there is no GPU
code to tune, so it runs the same Pallas kernels in the Pallas interpreter on tiny
shapes (the `...-interpret` ops): the search, validation, caching and reporting are
real, the timings measure the interpreter, and the table says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

from kerneltune._src.cli.demo_jobs import DemoJob as DemoJob
from kerneltune._src.cli.demo_jobs import jobs_for as jobs_for
from kerneltune._src.core import devices
from kerneltune._src.tuning.report import TuningReport, format_seconds


@dataclasses.dataclass
class Row:
    """What one tuned (or looked-up) key showed: where its config came from, and the
    tuning's report where it was tuned."""

    op_id: str
    signature: str
    dtype: str
    source: str
    winner: Any = None
    report: TuningReport | None = None


class _Recorder:
    """Collects the selection chain's events for the job being run."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **data: Any) -> None:
        self.events.append((event, data))

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        out, self.events = self.events, []
        return out


def _run_job(ex: Any, job: DemoJob, key: jax.Array) -> None:
    from kerneltune.kernels._common import kernel_for

    kernel: Any = kernel_for(job.kernel_type, ex, interpret=job.interpret)
    args, kwargs = job.make_args(key)
    if not job.grad:
        jax.block_until_ready(ex(kernel, *args, **kwargs))
        return

    def loss(*arrays: Any) -> jax.Array:
        return jnp.sum(ex(kernel, *arrays, **kwargs).astype(jnp.float32))

    jax.block_until_ready(jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args))


def _rows(events: list[tuple[str, dict[str, Any]]], job: DemoJob) -> list[Row]:
    """One row per key the job selected a config for (forward, backward)."""
    rows: list[Row] = []
    for event, data in events:
        op_id = data.get("op_id", "?")
        sig = f"{job.shape} ({'bwd' if '_bwd' in op_id else 'fwd'})" if job.grad else job.shape
        if event == "autotune_finish":
            report = data["report"]
            rows.append(Row(op_id, sig, job.dtype, "tuned", report.best, report))
        elif event == "cache_hit" or event == "heuristics" or event == "overlay_hit":
            level = data.get("level", event)
            rows.append(Row(op_id, sig, job.dtype, str(level), data.get("cfg")))
    return rows


def one_row_per_call(rows: list[Row]) -> list[Row]:
    """One row per (op, shape and direction): while a call is tuned, its backward (and
    other keys of it with nothing to tune) are selected again and again, each time an
    event; a row that tuned takes the place of the untuned rows of the same call, which
    would otherwise repeat beside it with nothing to tell them apart."""
    kept: dict[tuple[str, str, str], Row] = {}
    for row in rows:
        key = (row.op_id, row.signature, row.dtype)
        if key not in kept or (row.source == "tuned" and kept[key].source != "tuned"):
            kept[key] = row  # a replaced row keeps its place in the table
    return list(kept.values())


#: Short names for config fields in the demo's narrow table.
_SHORT_FIELDS = {
    "q_blocksize": "bq",
    "kv_blocksize": "bkv",
    "block_size": "block",
    "num_warps": "w",
    "num_stages": "s",
    "group_m": "gm",
}


def _compact_cfg(cfg: Any) -> str:
    """`MatmulConfig(bm=64, ..., backend="triton")` → `triton bm=64 ... w=4 s=3`."""
    if cfg is None:
        return "-"
    if not dataclasses.is_dataclass(cfg):
        return str(cfg)
    parts: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value is None:
            continue
        if f.name == "backend":
            parts.insert(0, str(value))
        else:
            parts.append(f"{_SHORT_FIELDS.get(f.name, f.name)}={value}")
    return " ".join(parts)


def _chain(persistent: Any, recorder: _Recorder) -> Any:
    from kerneltune._src.caching.cache import ConfigCache
    from kerneltune._src.selection.chain import AutotunePolicy, ConfigSelectorChain
    from kerneltune._src.tuning.tuner import Tuner

    return ConfigSelectorChain(
        ConfigCache(),
        policy=AutotunePolicy(),
        tuner=Tuner(progress=False),
        persistent=persistent,
        on_event=recorder,
    )


def _keys(job: DemoJob, key: jax.Array) -> list[tuple[str, str]]:
    """The (op@vN, call key) pairs a job selects configs for, computed from shapes
    alone (nothing runs): the kernel's key, and its backward kernel's for `grad` jobs."""
    from kerneltune._src.kernel.base import keys_training_apart, make_invocation

    kernel = job.kernel()
    args, kwargs = job.make_args(key)
    p_args, p_kwargs = kernel.prepare(*args, **kwargs)
    # Under a gradient, a kernel whose config picks its backward is keyed apart.
    training = True if job.grad and keys_training_apart(kernel) else None
    inv = make_invocation(kernel, p_args, p_kwargs, differentiated=training)
    out = [(kernel.op_id_v, inv.call_key)]
    backward = getattr(kernel, "backward", None)
    if job.grad and backward is not None:
        q = p_args[0]
        b, t, h, _ = q.shape
        lse = jax.ShapeDtypeStruct((b, h, t), jnp.float32)
        b_args, b_kwargs = backward.prepare(*p_args, q, lse, q, **p_kwargs)
        out.append((backward.op_id_v, make_invocation(backward, b_args, b_kwargs).call_key))
    return out


def _forget(persistent: Any, jobs: list[DemoJob], key: jax.Array) -> int:
    """Removes the demo's own keys from the persistent cache, so that the first pass
    tunes even when an earlier demo stored them. Returns how many were there."""
    dev = devices.device_fingerprint()
    return sum(
        persistent.delete(dev, op_v, call_key) for job in jobs for op_v, call_key in _keys(job, key)
    )


def run(args: argparse.Namespace) -> int:
    """The `kerneltune demo` command."""
    from kerneltune._src.cli.cache_commands import _open, print_table
    from kerneltune._src.execution.executor import Executor
    from kerneltune.kernels._common import on_gpu

    start = time.perf_counter()
    gpu = on_gpu()
    device = jax.devices()[0]
    persistent = _open(args)
    jobs = jobs_for(gpu)
    path = "pallas (triton)" if gpu else "pallas interpreter"
    print(
        f"kerneltune demo on {device.device_kind} ({device.platform}); fingerprint {devices.device_fingerprint()}"
    )
    print(f"persistent cache: {persistent.location}")
    if not gpu:
        print(
            "No GPU: the bundled Pallas kernels run in the Pallas interpreter on tiny shapes;\n"
            "tuning, validation and caching are real, the timings measure the interpreter."
        )
    key = jax.random.PRNGKey(0)
    removed = _forget(persistent, jobs, key)
    if removed:
        print(f"(re-tuning {removed} demo keys stored by an earlier run)")

    # Pass 1: tune.
    recorder = _Recorder()
    ex: Executor[Any, Any] = Executor(_chain(persistent, recorder))
    rows: list[Row] = []
    bar = _progress(jobs)
    for job in bar:
        bar.set_postfix_str(f"{job.op} {job.shape}")
        _run_job(ex, job, key)
        rows += _rows(recorder.take(), job)
    bar.close()
    rows = one_row_per_call(rows)

    print()
    timers = sorted({r.report.timer for r in rows if r.report is not None})
    timed = f", timed with the {' and '.join(timers)} timer" if timers else ""
    print(f"Tuned on {device.device_kind} ({path}){timed}:")
    table = [
        [_op_name(r.op_id), r.signature, _dtype_name(r.dtype), *_tuning_columns(r.report)]
        for r in rows
    ]
    header = ["op", "shape", "dtype", "tried/failed", "heuristic", "tuned", "speedup", "tuning"]
    print_table(header, table)

    # Pass 2: a fresh selector (as a new process would have) over the same cache.
    from kerneltune._src.caching.persistent import PersistentCache

    recorder2 = _Recorder()
    again: PersistentCache[Any] = PersistentCache(
        persistent.location, readonly=persistent.readonly_locations
    )
    ex2: Executor[Any, Any] = Executor(_chain(again, recorder2))
    print()
    print("Same calls again, from a fresh in-memory cache (as a new process would):")
    winners = {(r.op_id, r.signature): r.winner for r in rows}
    table = []
    for job in jobs:
        t0 = time.perf_counter()
        _run_job(ex2, job, key)
        elapsed = time.perf_counter() - t0
        for r in _rows(recorder2.take(), job):
            same = winners.get((r.op_id, r.signature))
            table.append(
                [
                    _op_name(r.op_id),
                    r.signature,
                    r.source,
                    "yes" if same == r.winner else "no",
                    f"{elapsed:.2f} s",
                    _compact_cfg(r.winner),
                ]
            )
    header = ["op", "shape", "config from", "same winner", "call", "config"]
    print_table(header, _fit_last_column(header, table, TABLE_WIDTH))
    tuned_total = sum(r.report.wall_s for r in rows if r.report is not None)
    print()
    print(
        f"Tuning took {tuned_total:.1f} s; the second pass tuned nothing. Total {time.perf_counter() - start:.1f} s."
    )
    print("See every candidate: kerneltune report (a table; --out report.png or report.html")
    print("adds the plots), or one call: kerneltune explain KEY (keys: kerneltune cache ls).")
    return 0


class _NoBar(list):  # type: ignore[type-arg]
    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(jobs: list[DemoJob]) -> Any:
    """A progress bar over the jobs on a terminal (tqdm), else a plain list."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar(jobs)
    return tqdm(jobs, desc="tuning", unit="call", file=sys.stderr, leave=False, disable=None)


#: The demo's tables fit a terminal this wide.
TABLE_WIDTH = 120


def _op_name(op_id_v: str) -> str:
    """`attention_bwd-interpret@v1` → `attention_bwd`: the heading says where it ran."""
    return op_id_v.partition("@")[0].removesuffix("-interpret")


def _dtype_name(dtype: str) -> str:
    from kerneltune._src.core.keys import SHORT_DTYPE_NAMES

    return SHORT_DTYPE_NAMES.get(dtype, dtype)


def _fit_last_column(header: list[str], rows: list[list[str]], width: int) -> list[list[str]]:
    """Shortens the last column (with "…") so that every line fits `width`."""
    every = [header, *rows]
    used = sum(max(len(r[i]) for r in every) + 2 for i in range(len(header) - 1))
    room = max(len(header[-1]), width - used)
    return [[*r[:-1], r[-1] if len(r[-1]) <= room else r[-1][: room - 1] + "…"] for r in rows]


def _tuning_columns(report: TuningReport | None) -> list[str]:
    """A row's tried/failed, heuristic, tuned, speedup and tuning columns."""
    if report is None:
        return ["-", "-", "-", "-", "nothing to tune"]
    heuristic, tuned = report.heuristic_time_s, report.best_time_s
    return [
        f"{report.num_evaluated}/{report.num_failed}",
        format_seconds(heuristic),
        format_seconds(tuned),
        f"{heuristic / tuned:.2f}x" if heuristic and tuned else "-",
        f"{report.wall_s:.2f} s",
    ]
