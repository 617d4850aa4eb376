"""What every per-op benchmark shares: the implementations compared (plain JAX, cuDNN,
tokamax, kerneltune heuristic and tuned), timing them side by side into a `Row`, and
one command line.

A family module (`attention_gpu`, `matmul_gpu`, `rowwise_gpu`) declares its ops as
`Family`s: how to make one op's rows at a shape, and its shapes (from the kernel's own
`shapes.py`). `run(families, argv)` is the command line every one of them, and
`model_gpu`, share.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
from benchmarks import harness as h
from benchmarks import model_blocks as mb
from benchmarks.results import Row, table, write_json
from kerneltune._src.caching.shipped import package_tables
from kerneltune._src.cli.demo_measure import program_peak

Impls = dict[str, Callable[..., Any] | None]


@dataclasses.dataclass(frozen=True)
class Settings:
    tune: bool  # time kerneltune tuned (tuning at real shapes takes minutes)
    tune_budget_s: float | None  # the tuner's budget per key (None: its default)
    tokamax: Any  # the module, or None
    bandwidth: float | None  # the copy's bytes per second
    shipped: bool = True  # the tuned column reads the shipped tables, as users' calls do


@dataclasses.dataclass(frozen=True)
class Family:
    """One op of a family: its rows at a shape, its shapes, and a tiny smoke set."""

    rows: Callable[[Any, Settings], list[Row]]
    shapes: Sequence[Any]
    smoke: Sequence[Any]
    rowwise: bool = False  # reports % of the copy bandwidth (needs it measured)


# --- the implementations ------------------------------------------------------------


def heuristic_executor() -> kt.Executor:
    """Uses each kernel's heuristic config, tunes nothing, stores nothing."""
    policy = kt.AutotunePolicy(cache_miss_fallback="heuristics")
    return kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache(), policy=policy, persistent=None))


@dataclasses.dataclass
class Tuning:
    """An executor tuning every miss into a fresh cache directory; what it chose."""

    executor: kt.Executor
    chosen: list[tuple[str, Any]]
    reports: list[Any] = dataclasses.field(default_factory=list)

    def summary(self, best: int = 4) -> list[str]:
        """Per tuned key: its fastest candidates and every failed one, one line each
        (why a tuned column chose what it did)."""
        lines = []
        for report in self.reports:
            if report is None:
                continue
            ok = sorted((c for c in report.candidates if c.time_s), key=lambda c: c.time_s)
            lines.append(f"{getattr(report, 'op_id', '?')}: best {report.best}")
            lines += [f"    {c.time_s * 1e3:.3f} ms  {c.cfg}" for c in ok[:best]]
            lines += [
                f"    {c.status}: {c.cfg}: {(c.error or '')[:160]}"
                for c in report.candidates
                if c.status != "ok"
            ]
        return lines


def tuning_executor(budget_s: float | None = None, *, shipped: bool = False) -> Tuning:
    """An executor that tunes every miss into a new, empty cache directory; with
    `shipped`, it also reads the tables shipped with kerneltune (exact hits, and warm
    starts near their shapes)."""
    chosen: list[tuple[str, Any]] = []
    reports: list[Any] = []

    def on_event(event: str, **data: Any) -> None:
        if event == "autotune_finish":
            chosen.append((data["op_id"], data.get("cfg")))
            reports.append(data.get("report"))

    cache: kt.PersistentCache[Any] = kt.PersistentCache(tempfile.mkdtemp(prefix="kt-bench-"))
    tuner = kt.Tuner(progress=False, time_budget_s=budget_s) if budget_s else None
    chain: kt.ConfigSelectorChain[Any, Any] = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        tuner=tuner,
        persistent=cache,
        on_event=on_event,
        shipped=package_tables() if shipped else None,
    )
    return Tuning(kt.Executor(chain), chosen, reports)


def tune_function(step: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, float, str]:
    """Tunes every kerneltune call in `step` from the default executor's (empty)
    caches: through `kt.autotune(step, *args)` where this checkout takes a function,
    else by its first call. Returns the context to run it in, the wall, and how."""
    t0 = time.perf_counter()
    try:
        autotune: Any = kt.autotune  # its function form (SPEC §8b) may be missing here
        result = autotune(step, *args)
    except TypeError as e:
        if "Kernel" not in str(e):  # only "this autotune takes kernels" means fall back
            raise
        return contextlib.nullcontext(), h.timed_first_call(step, args), "first call"
    wall = time.perf_counter() - t0
    return result, wall, f"kt.autotune(step, ...): {_what_was_kept(result)}"


def _what_was_kept(result: Any) -> str:
    """How many keys run a tuned config that differs from their heuristic (after the
    whole-function check, which may have put the heuristic configs back)."""
    from kerneltune._src.core.configs import config_to_dict

    entries = list(result)
    changed = 0
    for e in entries:
        try:
            changed += e.heuristic_cfg is not None and config_to_dict(e.cfg) != e.heuristic_cfg
        except TypeError:  # a config JSON cannot describe: count it as changed
            changed += 1
    return f"{changed} of {len(entries)} keys run a config other than their heuristic"


def backend_of(chosen: Sequence[tuple[str, Any]]) -> str:
    """The backends the tuned configs name ("cudnn", "pallas+xla" for a forward and a
    backward that differ); "default" for a config type without a backend field."""
    names = [str(getattr(cfg, "backend", None) or "default") for _, cfg in chosen]
    return "+".join(dict.fromkeys(names)) or "-"


def impls(op: str, st: Settings) -> tuple[Impls, Tuning | None]:
    """The op's implementations by column; a fresh tuning executor for each call, so
    every tuned row starts from an empty cache."""
    out: Impls = {"plain": getattr(mb.plain_ops(), op)}
    if op == "attention":
        out["plain"] = mb.jax_attention("xla")
        out["cudnn"] = mb.jax_attention("cudnn") if h.on_gpu() else None
    if st.tokamax is not None and op in ("attention", "layer_norm", "rms_norm"):
        out["tokamax"] = getattr(mb.tokamax_ops(st.tokamax), op)
    out["kt_heuristic"] = getattr(mb.kerneltune_ops(heuristic_executor()), op)
    tuning = tuning_executor(st.tune_budget_s, shipped=st.shipped) if st.tune else None
    if tuning is not None:
        out["kt_tuned"] = getattr(mb.kerneltune_ops(tuning.executor), op)
    return out, tuning


def fwd_bwd(f: Callable[..., jax.Array]) -> Callable[..., Any]:
    """The training-step form of a three-input op: value and gradients of its sum."""
    return jax.value_and_grad(lambda *a: f(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))


# --- timing -------------------------------------------------------------------------


def log(row: Row, name: str) -> None:
    """A progress line per implementation on stderr: a long run shows where it is."""
    t = row.times.get(name)
    what = f"{t * 1e6:.0f} us" if t else row.errors.get(name, "...")
    print(f"  {row.op} {row.pass_} {row.shape} {name}: {what}", file=sys.stderr, flush=True)


def measure(row: Row, fns: Impls, sets: Sequence[Any], tuning: Tuning | None) -> Row:
    """Times every implementation on the same argument sets, in interleaved rounds;
    each one's first call (tracing, tuning, compiling, one run) on the wall clock, and
    its compiled program's memory."""
    sessions, jitted = {}, {}
    for name, fn in fns.items():
        if fn is None:
            continue
        try:
            jitted[name] = jax.jit(fn)
            row.first_call_s[name] = h.timed_first_call(jitted[name], sets[0])
            if name == "kt_tuned":
                row.tune_s = row.first_call_s[name]
            peak = program_peak(jitted[name].lower(*sets[0]).compile())
            if peak is not None:
                row.peak_bytes[name] = peak
            sessions[name] = h.session(jitted[name], sets)
        except Exception as e:  # one failing implementation must not end the run
            row.errors[name] = h.error_text(e)
    if "kt_tuned" in sessions:
        row.same_program = h.same_program_as(
            {k: f for k, f in jitted.items() if k in sessions}, "kt_tuned", sets[0]
        )
    try:
        row.times.update(h.interleaved_times(sessions))
    except Exception as e:
        row.errors["timing"] = h.error_text(e)
    for name in fns:
        log(row, name)
    if tuning is not None:
        row.backend = backend_of(tuning.chosen)
    return row


# --- the command line ---------------------------------------------------------------


def parse(
    families: Mapping[str, Family],
    argv: Sequence[str] | None,
    doc: str,
    extra: Callable[[argparse.ArgumentParser], Any] | None = None,
) -> Any:
    """The shared command line; `extra` adds a script's own options (so that `--help`
    lists them)."""
    ops = tuple(families)
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes; no tokamax (CPU test)")
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    p.add_argument("--ops", default=",".join(ops), help=f"comma-separated subset of {ops}")
    p.add_argument("--shapes", type=int, default=None, help="only the first N shapes per op")
    p.add_argument("--no-tune", action="store_true", help="skip the kerneltune tuned column")
    p.add_argument("--tune-budget", type=float, default=None, help="tuner seconds per key")
    p.add_argument("--no-tokamax", action="store_true", help="do not import tokamax")
    p.add_argument(
        "--no-shipped",
        action="store_true",
        help="tune without the tables shipped with kerneltune (the default executor reads them)",
    )
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    unknown = sorted(set(args.ops.split(",")) - set(ops))
    if unknown:
        p.error(f"--ops: unknown {unknown}; choose from {ops}")
    return args


def run(
    families: Mapping[str, Family],
    argv: Sequence[str] | None,
    prog: str,
    doc: str,
    args: Any = None,
) -> list[Row]:
    """Runs the chosen ops at their shapes, prints one table, writes `--json`; returns
    the rows. `args`: `argv` already parsed (by `parse`)."""
    args = parse(families, argv, doc) if args is None else args
    chosen = [families[op] for op in args.ops.split(",")]
    rowwise = any(f.rowwise for f in chosen)
    bandwidth = h.copy_bandwidth(2**20 if args.smoke else 2**30) if rowwise else None
    tokamax = None if args.smoke or args.no_tokamax else mb.import_tokamax()
    st = Settings(not args.no_tune, args.tune_budget, tokamax, bandwidth, not args.no_shipped)
    rows = [
        row
        for f in chosen
        for shape in (f.smoke if args.smoke else f.shapes)[: args.shapes]
        for row in f.rows(shape, st)
    ]
    print(table(rows))
    if bandwidth:
        print(f"copy bandwidth (read + write): {bandwidth / 1e9:.0f} GB/s")
    if args.json:
        write_json(
            args.json,
            rows,
            command=" ".join([f"python -m {prog}", *(argv or sys.argv[1:])]),
            copy_bandwidth_bytes_per_s=bandwidth,
            tokamax=getattr(tokamax, "__version__", None),
        )
    return rows
