"""kerneltune's ops and two transformer blocks against what a JAX user already has.

    python -m benchmarks.model_gpu [--json OUT.json] [--ops attention,gpt,...]
    python -m benchmarks.model_gpu --smoke      # tiny shapes, any device, wall clock

Run from the repository root; one run prints one table (µs per call unless marked).
Per op at realistic shapes: plain XLA/`jnp`, cuDNN (attention), tokamax (when it
imports), kerneltune with its heuristic config and autotuned from an empty cache, the
backend the tuned configs name, best other ÷ tuned time (> 1: tuned is faster), and
for norms and softmax kerneltune's % of a copy's bandwidth measured in the run. Then a
GPT-style and a Llama-style block's jitted `value_and_grad` training step: plain JAX
(cuDNN attention), kerneltune heuristic and tuned, tokamax; "tune s" is the tuning wall.
benchmarks/README.md says what each column means and how to bring peers: nothing is
installed here, e.g. `pip install --no-index --no-deps --target /tmp/site .whl/*.whl`,
then `PYTHONPATH=/tmp/site python3 -m benchmarks.model_gpu`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
from benchmarks import harness as h
from benchmarks import model_blocks as mb

F32 = jnp.float32
GPT = mb.BlockShape(batch=8, seq=2048, dim=2048, heads=16, kv_heads=16, hidden=8192)
LLAMA = mb.BlockShape(batch=8, seq=2048, dim=2048, heads=16, kv_heads=4, hidden=5632)
SHAPES: dict[str, Any] = {  # attention (B, T, N, H, causal); rows × width; (m, k, n)
    "attention": [(8, 1024, 16, 128, False), (4, 2048, 32, 64, True),
                  (2, 4096, 16, 128, True), (1, 8192, 32, 64, False)],
    "layer_norm": [(16384, 1024), (16384, 4096), (8192, 8192), (4096, 16384)],
    "rms_norm": [(16384, 1024), (16384, 4096), (8192, 8192), (4096, 16384)],
    "softmax": [(16384, 1024), (16384, 2048), (8192, 8192), (4096, 32768)],
    "matmul": [(4096, 4096, 4096), (8192, 8192, 8192), (64, 8192, 8192), (16384, 1024, 16384)],
    "gpt": [GPT], "llama": [LLAMA],
}  # fmt: skip
SMOKE: dict[str, Any] = {  # every code path once (attention: causal and not)
    "attention": [(1, 64, 2, 32, True), (1, 128, 2, 64, False)],
    "layer_norm": [(64, 128)], "rms_norm": [(32, 256)], "softmax": [(64, 128)],
    "matmul": [(8, 128, 64)],
    "gpt": [mb.BlockShape(1, 64, 64, 2, 2, 128)], "llama": [mb.BlockShape(1, 64, 64, 4, 2, 96)],
}  # fmt: skip
OPS = tuple(SHAPES)


@dataclasses.dataclass(frozen=True)
class Settings:
    tune: bool  # time kerneltune tuned (tuning at real shapes takes minutes)
    tune_budget_s: float | None  # the tuner's budget per key (None: its default)
    tokamax: Any  # the module, or None
    bandwidth: float | None  # the copy's bytes per second
    shipped: bool = True  # the tuned column reads the shipped tables, as users' calls do


Impls = dict[str, Callable[..., Any] | None]


def _log(row: h.Row, name: str) -> None:
    """A progress line per implementation on stderr: a long run shows where it is."""
    t = row.times.get(name)
    what = f"{t * 1e6:.0f} us" if t else row.errors.get(name, "...")
    print(f"  {row.op} {row.pass_} {row.shape} {name}: {what}", file=sys.stderr, flush=True)


def _fwd_bwd(f: Callable[..., jax.Array]) -> Callable[..., Any]:
    return jax.value_and_grad(lambda *a: f(*a).astype(F32).sum(), argnums=(0, 1, 2))


def _impls(op: str, st: Settings) -> tuple[Impls, h.Tuning | None]:
    """The op's implementations by column; a fresh tuning executor for each call, so
    every tuned row starts from an empty cache."""
    impls: Impls = {"plain": getattr(mb.plain_ops(), op)}
    if op == "attention":
        impls["plain"] = mb.jax_attention("xla")
        impls["cudnn"] = mb.jax_attention("cudnn") if h.on_gpu() else None
    if st.tokamax is not None and op in ("attention", "layer_norm", "rms_norm"):
        impls["tokamax"] = getattr(mb.tokamax_ops(st.tokamax), op)
    impls["kt_heuristic"] = getattr(mb.kerneltune_ops(h.heuristic_executor()), op)
    tuning = h.tuning_executor(st.tune_budget_s, shipped=st.shipped) if st.tune else None
    if tuning is not None:
        impls["kt_tuned"] = getattr(mb.kerneltune_ops(tuning.executor), op)
    return impls, tuning


def measure(row: h.Row, impls: Impls, sets: Sequence[Any], tuning: h.Tuning | None) -> h.Row:
    """Times every implementation on the same argument sets, in interleaved rounds;
    the tuned one's first call (tracing, tuning, compiling) is timed on the wall clock
    too."""
    sessions = {}
    for name, fn in impls.items():
        if fn is None:
            continue
        try:
            jitted = jax.jit(fn)
            if name == "kt_tuned":
                row.tune_s = h.timed_first_call(jitted, sets[0])
            sessions[name] = h.session(jitted, sets)
        except Exception as e:  # one failing implementation must not end the run
            row.errors[name] = h.error_text(e)
    try:
        row.times.update(h.interleaved_times(sessions))
    except Exception as e:
        row.errors["timing"] = h.error_text(e)
    for name in impls:
        _log(row, name)
    if tuning is not None:
        row.backend = h.backend_of(tuning.chosen)
    return row


def attention_rows(shape: tuple[int, int, int, int, bool], st: Settings) -> list[h.Row]:
    b, t, n, d, causal = shape
    sets = h.arg_sets(lambda seed: tuple(h.normal(3 * seed + i, (b, t, n, d)) for i in range(3)))
    text = f"B{b} T{t} N{n} H{d}" + (" causal" if causal else "")
    rows = []
    for pass_, wrap in (("fwd", lambda f: f), ("fwd+bwd", _fwd_bwd)):
        impls, tuning = _impls("attention", st)
        fns = {k: f and wrap(functools.partial(f, causal=causal)) for k, f in impls.items()}
        rows.append(measure(h.Row("attention", pass_, text), fns, sets, tuning))
    return rows


def rowwise_rows(op: str, shape: tuple[int, int], st: Settings) -> list[h.Row]:
    """layer_norm, rms_norm, softmax over the last axis of `[rows, width]`, with the %
    of copy bandwidth that kerneltune reaches (tuned, else heuristic)."""
    rows_, width = shape
    params = {"layer_norm": 2, "rms_norm": 1, "softmax": 0}[op]

    def make(seed: int) -> tuple[jax.Array, ...]:
        extra = tuple(h.normal(100 + seed + i, (width,)) for i in range(params))
        return (h.normal(seed, shape), *extra)

    impls, tuning = _impls(op, st)
    row = measure(h.Row(op, "fwd", f"{rows_}x{width}"), impls, h.arg_sets(make), tuning)
    row.bytes_moved = 2 * rows_ * width * 2  # bf16 read once, written once
    kt_time = row.times.get("kt_tuned") or row.times.get("kt_heuristic")
    if kt_time and st.bandwidth:
        row.pct_copy = 100 * row.bytes_moved / kt_time / st.bandwidth
    return [row]


def matmul_rows(shape: tuple[int, int, int], st: Settings) -> list[h.Row]:
    m, k, n = shape
    sets = h.arg_sets(lambda seed: (h.normal(2 * seed, (m, k)), h.normal(2 * seed + 1, (k, n))))
    impls, tuning = _impls("matmul", st)
    return [measure(h.Row("matmul", "fwd", f"{m}x{k}x{n}"), impls, sets, tuning)]


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
    from kerneltune._src.configs import config_to_dict

    entries = list(result)
    changed = 0
    for e in entries:
        try:
            changed += e.heuristic_cfg is not None and config_to_dict(e.cfg) != e.heuristic_cfg
        except TypeError:  # a config JSON cannot describe: count it as changed
            changed += 1
    return f"{changed} of {len(entries)} keys run a config other than their heuristic"


def _within(context: Any, timed: Callable[[], float]) -> float:
    """One timing session inside `context` (where the tuned program was traced, so
    the same compiled program runs)."""
    with context:
        return timed()


def block_rows(block: str, s: mb.BlockShape, st: Settings) -> list[h.Row]:
    """One training step of a block: plain JAX, kerneltune heuristic and tuned,
    tokamax; each implementation's first-call wall in `first_call_s`."""
    args = mb.block_inputs(block, s)
    row = h.Row(block, "train", str(s))
    variants = {"plain": mb.plain_ops(), "kt_heuristic": mb.kerneltune_ops(h.heuristic_executor())}
    if st.tokamax is not None:
        variants["tokamax"] = mb.tokamax_ops(st.tokamax)
    sessions = {}
    for name, ops in variants.items():
        try:
            step = mb.train_step(block, ops, s)
            row.first_call_s[name] = h.timed_first_call(step, args)
            sessions[name] = h.session(step, [args])
        except Exception as e:
            row.errors[name] = h.error_text(e)
        _log(row, name)
    if st.tune:
        tuning = h.tuning_executor(st.tune_budget_s, shipped=st.shipped)
        kt.set_default_executor(tuning.executor)  # what `kt.autotune(f)` and the ops use
        _log(row, "kt_tuned")  # tuning a block takes a while
        try:
            step = mb.train_step(block, mb.kerneltune_ops(), s)
            context, row.tune_s, row.note = tune_function(step, args)
            with context:
                # The tuned configs are compiled into the program here, once.
                tuned = h.session(step, [args])
            sessions["kt_tuned"] = functools.partial(_within, context, tuned)
            row.backend = h.backend_of(tuning.chosen)
        except Exception as e:
            row.errors["kt_tuned"] = h.error_text(e)
        finally:
            kt.set_default_executor(None)
    row.times.update(h.interleaved_times(sessions))
    for name in sessions:
        _log(row, name)
    return [row]


def rows_for(op: str, shape: Any, st: Settings) -> list[h.Row]:
    if op in mb.BLOCKS:
        return block_rows(op, shape, st)
    if op == "attention":
        return attention_rows(shape, st)
    return matmul_rows(shape, st) if op == "matmul" else rowwise_rows(op, shape, st)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes; no tokamax (CPU test)")
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {OPS}")
    p.add_argument("--shapes", type=int, default=None, help="only the first N shapes per op")
    p.add_argument("--no-tune", action="store_true", help="skip the kerneltune tuned column")
    p.add_argument("--tune-budget", type=float, default=None, help="tuner seconds per key")
    p.add_argument("--no-tokamax", action="store_true", help="do not import tokamax")
    p.add_argument(
        "--no-shipped",
        action="store_true",
        help="tune without the tables shipped with kerneltune (the default executor reads them)",
    )
    args = p.parse_args(argv)
    unknown = sorted(set(args.ops.split(",")) - set(OPS))
    if unknown:
        p.error(f"--ops: unknown {unknown}; choose from {OPS}")
    return args


def main(argv: Sequence[str] | None = None) -> list[h.Row]:
    """Runs the benchmark, prints its table, writes `--json`; returns the rows."""
    args = parse(argv)
    ops = args.ops.split(",")
    shapes = SMOKE if args.smoke else SHAPES
    rowwise = any(op in ("layer_norm", "rms_norm", "softmax") for op in ops)
    bandwidth = h.copy_bandwidth(2**20 if args.smoke else 2**30) if rowwise else None
    tokamax = None if args.smoke or args.no_tokamax else mb.import_tokamax()
    st = Settings(not args.no_tune, args.tune_budget, tokamax, bandwidth, not args.no_shipped)
    rows = [r for op in ops for shape in shapes[op][: args.shapes] for r in rows_for(op, shape, st)]
    print(h.table(rows))
    if bandwidth:
        print(f"copy bandwidth (read + write): {bandwidth / 1e9:.0f} GB/s")
    if args.json:
        h.write_json(
            args.json,
            rows,
            command=" ".join(["python -m benchmarks.model_gpu", *(argv or sys.argv[1:])]),
            copy_bandwidth_bytes_per_s=bandwidth,
            tokamax=getattr(tokamax, "__version__", None),
        )
    return rows


if __name__ == "__main__":
    main()
