"""The grouped matmul (`ragged_dot`) against `jax.lax.ragged_dot` and tokamax, and a
mixture-of-experts block's training step on all three.

    python -m benchmarks.ragged_dot_gpu [--quick] [--json OUT.json] [--no-tune] [--smoke]

Ops: forward and forward + backward (value and gradients of the sum) at six shapes:
64 experts, 32768 routed rows × 2048 → 1408 and Mixtral-like 8 experts, 16384 × 4096 →
14336, each with balanced routing, skewed (Zipf-like) routing, and skewed with empty
experts. Block: `examples/moe/model.py`'s block (fine: 64 experts top-8 D2048 F1408;
coarse: 8 experts top-2 D4096 F14336), balanced and skewed, one SGD step timed.

Columns: `plain` (`jax.lax.ragged_dot`), `tokamax` (`tokamax.ragged_dot`, when it
imports), `kt heur` (kerneltune's heuristic configs, nothing tuned) and `kt tuned`
(tuned into a fresh cache, `--tune-budget` seconds per key, by one executor for the
whole run: keys ignore routing, so each shape class is tuned once, on a balanced
routing, and its first row's `tune s` holds the tuning). Times are CUPTI device time
(median of interleaved rounds); `first call` is the wall time of each implementation's
first call (tracing, tuning, compiling); `peak` is the compiled program's memory
(arguments + outputs + temporaries). `--quick` times two shapes and one block per
class without tuning. The whole run takes under 7 minutes on an H100.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness as h
from benchmarks import model_blocks as mb
from benchmarks import op_bench
from benchmarks.results import Row, table, write_json
from examples.moe import model
from kerneltune.kernels import ragged_dot
from kerneltune.kernels.ragged_dot import shapes

#: (m, k, n, g, routing, empty experts)
OP_CASES = tuple(
    (*shape, routing, empty)
    for shape in shapes.BENCH_SHAPES
    for routing, empty in (("balanced", 0), ("skewed", 0), ("skewed", shape[3] // 8))
)
SMOKE_CASES = ((64, 32, 32, 4, "balanced", 0), (64, 32, 32, 4, "skewed", 1))
SMOKE_BLOCK = model.MoEShape("smoke", 32, 32, 32, 4, 2, skew=1.0)


def routing(m: int, g: int, kind: str, empty: int) -> jax.Array:
    sizes = shapes.balanced(m, g) if kind == "balanced" else shapes.skewed(m, g, empty=empty)
    return jnp.asarray(sizes, jnp.int32)


def peak_bytes(fn: Callable[..., Any], args: Sequence[Any]) -> int | None:
    """The compiled program's memory: arguments, outputs and temporaries."""
    try:
        stats = jax.jit(fn).lower(*args).compile().memory_analysis()
    except Exception:
        return None
    if stats is None:
        return None
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes)


def ops_by_column(tokamax: Any, tuning: op_bench.Tuning | None) -> dict[str, Any]:
    """`ragged_dot` by column. One tuning executor serves the whole run: keys ignore
    the routing, so each shape class is tuned once (on a balanced routing) and the
    skewed rows reuse its configs, as a training run would."""
    cols: dict[str, Any] = {"plain": jax.lax.ragged_dot}
    if tokamax is not None:
        cols["tokamax"] = lambda a, b, s: tokamax.ragged_dot(a, b, s)
    heur = op_bench.heuristic_executor()
    cols["kt_heuristic"] = lambda a, b, s: ragged_dot(a, b, s, executor=heur)
    if tuning is not None:
        ex = tuning.executor
        cols["kt_tuned"] = lambda a, b, s: ragged_dot(a, b, s, executor=ex)
    return cols


def measure(row: Row, fns: dict[str, Any], sets: Sequence[Any], tuning: Any) -> Row:
    """`op_bench.measure`, with the backends of the configs this row tuned (none
    when an earlier row tuned its keys)."""
    before = len(tuning.chosen) if tuning is not None else 0
    op_bench.measure(row, fns, sets, None)
    if tuning is not None:
        new = tuning.chosen[before:]
        row.backend = op_bench.backend_of(new) if new else "(tuned above)"
    return row


def first_calls_and_peaks(row: Row, fns: dict[str, Any], args: Sequence[Any]) -> None:
    """Each implementation's first-call wall time and compiled memory, in the row."""
    peaks = []
    for name, fn in fns.items():
        if fn is None or name == "kt_tuned":  # measure() times the tuned first call
            continue
        try:
            row.first_call_s[name] = h.timed_first_call(jax.jit(fn), args)
        except Exception as e:
            row.errors[name] = h.error_text(e)
            continue
        peak = peak_bytes(fn, args)
        if peak is not None:
            peaks.append(f"{name} {peak / 2**30:.2f} GiB")
    first = ", ".join(f"{k} {v:.1f}s" for k, v in row.first_call_s.items())
    row.note = f"{row.pass_}: first call {first}; peak {', '.join(peaks) or '-'}"


def op_rows(case: tuple[Any, ...], st: op_bench.Settings, tuning: Any) -> list[Row]:
    m, k, n, g, kind, empty = case
    sizes = routing(m, g, kind, empty)
    shape = f"{m}x{k}->{n} E{g} {kind}" + (f" empty{empty}" if empty else "")
    sets = h.arg_sets(lambda seed: (h.normal(2 * seed, (m, k)), h.normal(2 * seed + 1, (g, k, n))))
    out = []
    for pass_ in ("fwd", "fwd+bwd"):
        cols = ops_by_column(st.tokamax, tuning)

        def bind(f: Any, pass_: str = pass_) -> Any:
            if pass_ == "fwd":
                return lambda a, b: f(a, b, sizes)
            return jax.value_and_grad(
                lambda a, b: f(a, b, sizes).astype(jnp.float32).sum(), argnums=(0, 1)
            )

        fns = {name: bind(f) for name, f in cols.items()}
        row = Row("ragged_dot", pass_, shape)
        first_calls_and_peaks(row, fns, sets[0])
        out.append(measure(row, fns, sets, tuning))
    return out


def block_rows(s: model.MoEShape, st: op_bench.Settings, tuning: Any) -> list[Row]:
    params = model.init_params(s)
    x, target = model.inputs(s)
    sets = [(params, x, target)]
    cols = ops_by_column(st.tokamax, tuning)
    fns = {name: model.train_step(model.ops_namespace(name, f), s) for name, f in cols.items()}
    row = Row("moe_block", "train", str(s))
    first_calls_and_peaks(row, fns, sets[0])
    return [measure(row, fns, sets, tuning)]


def main(argv: Sequence[str] | None = None) -> list[Row]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="two op shapes, two blocks, no tuning")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, no tokamax (CPU test)")
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    p.add_argument("--no-tune", action="store_true", help="skip the kerneltune tuned column")
    p.add_argument("--tune-budget", type=float, default=10.0, help="tuner seconds per key")
    p.add_argument("--no-tokamax", action="store_true", help="do not import tokamax")
    p.add_argument("--no-block", action="store_true", help="skip the MoE block")
    p.add_argument("--blocks-only", action="store_true", help="only the MoE block")
    p.add_argument("--cases", metavar="I,J", help="only these op cases (indices into OP_CASES)")
    p.add_argument("--blocks", metavar="I,J", help="only these blocks (indices into GPU_SHAPES)")
    args = p.parse_args(argv)
    tokamax = None if args.smoke or args.no_tokamax else mb.import_tokamax()
    tune = not (args.no_tune or args.quick)
    st = op_bench.Settings(tune, args.tune_budget, tokamax, None)
    if args.smoke:
        cases, blocks = SMOKE_CASES, (SMOKE_BLOCK,)
    elif args.quick:
        cases = (OP_CASES[0], OP_CASES[3])
        blocks = (model.GPU_SHAPES[0], model.GPU_SHAPES[2])
    else:
        cases, blocks = OP_CASES, model.GPU_SHAPES
    if args.cases:
        cases = tuple(cases[int(i)] for i in args.cases.split(","))
    if args.blocks:
        blocks = tuple(blocks[int(i)] for i in args.blocks.split(","))
    if args.blocks_only:
        cases = ()
    tuning = op_bench.tuning_executor(args.tune_budget, shipped=True) if tune else None
    rows = [row for case in cases for row in op_rows(case, st, tuning)]
    if not args.no_block:
        rows += [row for s in blocks for row in block_rows(s, st, tuning)]
    print(table(rows))
    better = [r.times.get("plain") / r.times["kt_tuned"] for r in rows
              if r.times.get("plain") and r.times.get("kt_tuned")]  # fmt: skip
    if better:
        print(f"kt tuned vs plain jax.lax.ragged_dot: {min(better):.1f}x to {max(better):.1f}x")
    if args.json:
        write_json(
            args.json,
            rows,
            command=" ".join(["python -m benchmarks.ragged_dot_gpu", *(argv or sys.argv[1:])]),
            tokamax=getattr(tokamax, "__version__", None),
            routing_sizes={
                f"{m}x{k}->{n} E{g} {kind} empty{e}": np.asarray(routing(m, g, kind, e)).tolist()
                for m, k, n, g, kind, e in cases
            },
        )
    return rows


if __name__ == "__main__":
    main()
