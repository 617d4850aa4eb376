"""The expert-parallel mixture-of-experts block's training step on 1, 2 and 4 GPUs
(whatever this machine has) on kerneltune, tokamax and plain `jax.lax.ragged_dot`; and
`ragged_dot` with `group_offset` against the same work renumbered.

    python -m benchmarks.expert_parallel_gpu [--json OUT.json]        # everything
    python -m benchmarks.expert_parallel_gpu --blocks fine --gpus 1,4  # a subset
    python -m benchmarks.expert_parallel_gpu --offset-only             # part 2 alone
    python -m benchmarks.expert_parallel_gpu --smoke                   # tiny, any device

**Part 1, the block** (`examples/moe_ep/model.py`), weak scaling: the tokens per GPU are
fixed (fine: 4096 tokens per GPU, 64 experts top-8, D 2048, F 1408; coarse: 8192 tokens
per GPU, 8 experts top-2, D 4096, F 14336; bf16), one SGD step (value and gradients,
update). With `n` GPUs the mesh is the first `n` local devices on the expert axis
(`n` must divide the experts). Dispatch: `--dispatch` (default "auto": the dense all-to-all;
"ragged": `ragged_all_to_all`, whose XLA GPU kernel is slow), each device receiving at most
`--capacity-factor` (default 1.25) times the rows it routes (`--capacity-factor 0`: no
limit, the worst case allocated). Implementations: `plain` (`jax.lax.ragged_dot`, which
may run out of memory: said so), `tokamax` (`tokamax.ragged_dot`, where it imports),
`kt heur` (kerneltune's heuristic configs) and `kt tuned` (every key tuned on its first
call, `--tune-budget` seconds a key, into an empty cache with the shipped tables).

Columns: `step ms` is wall time, since one step spans every GPU and its collectives:
per round, a burst of back-to-back steps and its mean; the median over
`--rounds` rounds, the implementations interleaved in each. `tokens/s` (global),
`eff` (tokens/s per GPU ÷ the same implementation's at 1 GPU: weak-scaling efficiency),
`×tokamax` and `×plain` (their step time ÷ this one's), `first s` (the first call's wall:
tracing, tuning, compiling, one step) and `peak GiB` (the compiled program's memory on
one device: arguments, outputs, temporaries).

**Part 2, `group_offset`** on one GPU: `ragged_dot` forward + backward (value and
gradients of the sum) over a globally sorted batch with a balanced routing over `G`
experts, `G_local` of them local in the middle (`--offset-counts`: three counts per
shape), against the same local groups renumbered to the top of the same rows (no
offset: the layout a ragged all-to-all gives). CUPTI device time, medians of
interleaved rounds (`harness.py`). `renum ÷ offset` > 1 means the offset call is the
faster; the issue's bar is ≥ 0.98. Rows: `kt heur` (each call's heuristic configs: the
two may differ in backend, JAX's Mosaic kernel multiplying every row), `kt triton`
(every product on its Triton heuristic config: the same kernel with and without the
offset) and `kt tuned`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
from benchmarks import harness as h
from benchmarks import model_blocks as mb
from benchmarks import op_bench
from examples.moe import model as moe
from examples.moe_ep import model as ep
from kerneltune.kernels import ragged_dot
from kerneltune.kernels.ragged_dot import config as rd_config
from kerneltune.kernels.ragged_dot import shapes

#: Per-GPU blocks (`tokens` is per GPU; weak scaling multiplies it by the GPU count).
BLOCKS = {
    "fine": moe.MoEShape("fine", 4096, 2048, 1408, 64, 8),
    "coarse": moe.MoEShape("coarse", 8192, 4096, 14336, 8, 2),
}
SMOKE_BLOCKS = {"tiny": moe.MoEShape("tiny", 16, 32, 32, 8, 2)}
#: Part 2: (rows, K, N, G, the G_local counts).
OFFSET_CASES = (
    (32768, 2048, 1408, 64, (8, 16, 32)),
    (16384, 4096, 14336, 8, (1, 2, 4)),
)
SMOKE_OFFSET_CASES = ((64, 32, 32, 8, (1, 2, 4)),)
ROUNDS = 7
IMPLS = ("plain", "tokamax", "kt_heuristic", "kt_tuned")


def error_cell(e: BaseException) -> str:
    """ "OOM" for an out-of-memory error, else `Type: first line`."""
    text = str(e)
    if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
        return "OOM"
    return h.error_text(e)


# --- part 1: the block ---------------------------------------------------------------


@dataclasses.dataclass
class BlockRow:
    """One implementation of one block on `gpus` GPUs."""

    block: str
    gpus: int
    impl: str
    dispatch: str = "-"
    step_s: float | None = None
    tokens: int = 0
    first_call_s: float | None = None
    peak_bytes: int | None = None
    error: str | None = None
    efficiency: float | None = None
    vs_tokamax: float | None = None
    vs_plain: float | None = None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.step_s if self.step_s else None


def namespaces(tokamax: Any, tuning: op_bench.Tuning | None) -> dict[str, Any]:
    out: dict[str, Any] = {"plain": moe.jax_ops()}
    if tokamax is not None:
        out["tokamax"] = moe.tokamax_ops(tokamax)
    out["kt_heuristic"] = moe.kerneltune_ops(op_bench.heuristic_executor())
    if tuning is not None:
        out["kt_tuned"] = moe.kerneltune_ops(tuning.executor)
    return out


def burst_session(step: Callable[..., Any], args: Sequence[Any], calls: int) -> Callable[[], float]:
    """Each call: `calls` steps back to back (`harness.burst_seconds`); returns seconds
    per step. Off GPUs each step is waited for: with several steps of a program with
    collectives in flight on 4 fake CPU devices of a loaded 2-core machine, XLA:CPU
    aborted the process (jax 0.10.2)."""
    in_flight = h.on_gpu()
    return lambda: h.burst_seconds(step, [args], calls, in_flight=in_flight)


def peak_of(compiled: Any) -> int | None:
    """Arguments + outputs + temporaries of a compiled program on one device, or None."""
    try:
        stats = compiled.memory_analysis()
    except Exception:
        return None
    if stats is None:
        return None
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes)


def kernel_breakdown(name: str, step: Any, args: Sequence[Any], top: int = 12) -> None:
    """One step of a compiled program kernel by kernel (CUPTI device time, every GPU's
    kernels together), the `top` longest printed: where a step's time goes."""
    from jax.experimental.mosaic.gpu import profiler

    _, per_kernel = profiler.measure(h._Cycle(step, [args]), aggregate=False)()
    total = sum(ms for _, ms in per_kernel)
    print(f"    {name}: {len(per_kernel)} kernels, {total:.2f} ms", file=sys.stderr)
    for kernel, ms in sorted(per_kernel, key=lambda t: -t[1])[:top]:
        print(f"      {ms:8.3f} ms  {kernel[:100]}", file=sys.stderr)


def block_rows(
    s1: moe.MoEShape,
    gpus: int,
    cfg: ep.EPConfig,
    impls: dict[str, Any],
    rounds: int,
    kernels: bool = False,
) -> list[BlockRow]:
    """Every implementation's step on the first `gpus` local devices, timed side by
    side (interleaved rounds); with `kernels`, each step's longest kernels printed."""
    s = dataclasses.replace(s1, tokens=s1.tokens * gpus)
    mesh = ep.make_mesh(gpus, 1, jax.local_devices(), cfg)
    dtype = jnp.bfloat16 if h.on_gpu() else jnp.float32
    params = moe.init_params(s, dtype)
    x, target = moe.inputs(s, dtype)
    args = ep.shard(mesh, cfg, params, x, target)
    del params, x, target
    rows, sessions = [], {}
    for name, ops in impls.items():
        row = BlockRow(s1.name, gpus, name, tokens=s.tokens)
        rows.append(row)
        try:
            block = ep.ep_moe_block(ops, mesh, s, cfg)
            row.dispatch = block.dispatch
            # The first call lowers, compiles and runs the step once; the compiled
            # program is then timed and its memory read (no second compile).
            t0 = time.perf_counter()
            step = jax.jit(ep.train_step(block)).lower(*args).compile()
            jax.block_until_ready(step(*args))
            row.first_call_s = time.perf_counter() - t0
            row.peak_bytes = peak_of(step)
            once = statistics.median(burst_session(step, args, 1)() for _ in range(3))
            calls = max(2, min(50, round(h.SESSION_S / max(once, 1e-6))))
            sessions[name] = burst_session(step, args, calls)
            if kernels:
                kernel_breakdown(f"{s1.name} x{gpus} {name}", step, args)
        except Exception as e:  # one failing implementation must not end the run
            row.error = error_cell(e)
        print(
            f"  {s1.name} x{gpus} {name}: " + (row.error or f"first call {row.first_call_s:.1f} s"),
            file=sys.stderr,
            flush=True,
        )
    try:
        times = h.interleaved_times(sessions, rounds)
    except Exception as e:
        for row in rows:
            row.error = row.error or error_cell(e)
        return rows
    for row in rows:
        row.step_s = times.get(row.impl)
    by = {r.impl: r.step_s for r in rows}
    for row in rows:
        if row.step_s:
            if by.get("tokamax"):
                row.vs_tokamax = by["tokamax"] / row.step_s
            if by.get("plain"):
                row.vs_plain = by["plain"] / row.step_s
    return rows


def add_efficiency(rows: list[BlockRow]) -> None:
    """Weak-scaling efficiency: tokens/s per GPU ÷ the same implementation's at 1 GPU."""
    one = {(r.block, r.impl): r.tokens_per_s for r in rows if r.gpus == 1}
    for r in rows:
        base, mine = one.get((r.block, r.impl)), r.tokens_per_s
        if base and mine:
            r.efficiency = mine / r.gpus / base


def block_table(rows: Sequence[BlockRow]) -> str:
    header = ["block", "GPUs", "impl", "dispatch", "step ms", "tokens/s", "eff", "×tokamax",
              "×plain", "first s", "peak GiB"]  # fmt: skip

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [header]
    for r in rows:
        step = r.error if r.error else f(r.step_s and r.step_s * 1e3, ".2f")
        lines.append([
            r.block, str(r.gpus), r.impl.replace("_", " "), r.dispatch, step,
            f(r.tokens_per_s, ",.0f"), f(r.efficiency, ".0%"), f(r.vs_tokamax, ".2f"),
            f(r.vs_plain, ".2f"), f(r.first_call_s, ".1f"),
            f(r.peak_bytes and r.peak_bytes / 2**30, ".2f"),
        ])  # fmt: skip
    return _format(lines)


def _format(lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = ["  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in lines]  # fmt: skip
    text.insert(1, "-" * len(text[0]))
    return "\n".join(text)


# --- part 2: group_offset against renumbered groups ----------------------------------


@dataclasses.dataclass
class OffsetRow:
    shape: str
    g_local: int
    impl: str
    offset_s: float | None = None
    renumbered_s: float | None = None
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        """Renumbered time ÷ offset time (≥ 1: the offset call is no slower)."""
        if self.offset_s and self.renumbered_s:
            return self.renumbered_s / self.offset_s
        return None


class TritonHeuristic:
    """A chooser that runs every ragged_dot product (forward, d_lhs, d_rhs) with its
    Triton heuristic config: the offset and renumbered calls on one kernel family (the
    GPU heuristic may give them different backends: JAX's Mosaic kernel multiplies
    every row, so an offset call with few local groups goes to Triton)."""

    def choose(self, inv: Any, kernel: Any) -> Any:
        return rd_config.triton_heuristic(kernel.problem(inv))


def offset_rows(
    case: tuple[Any, ...], tuning: op_bench.Tuning | None, rounds: int
) -> list[OffsetRow]:
    m, k, n, g, counts = case
    dtype = jnp.bfloat16 if h.on_gpu() else jnp.float32
    sizes_np = shapes.balanced(m, g)
    sizes = jnp.asarray(sizes_np)
    executors = {
        "kt_heuristic": op_bench.heuristic_executor(),
        "kt_triton": kt.Executor(TritonHeuristic()),
    }
    if tuning is not None:
        executors["kt_tuned"] = tuning.executor
    out = []
    for local in counts:
        offset = (g - local) // 2
        start = int(sizes_np[:offset].sum())
        mine = jnp.asarray(sizes_np[offset : offset + local])

        def make(seed: int, start: int = start, local: int = local) -> tuple[Any, ...]:
            lhs = h.normal(2 * seed, (m, k), dtype)
            rhs = h.normal(2 * seed + 1, (local, k, n), dtype)
            # The renumbered layout: the same rows, the local groups' at the top.
            return lhs, rhs, jnp.roll(lhs, -start, axis=0)

        sets = h.arg_sets(make)
        shape = f"{m}x{k}->{n} G{g}"
        for impl, ex in executors.items():
            row = OffsetRow(shape, local, impl)
            out.append(row)

            def with_offset(a: Any, b: Any, _: Any, ex: Any = ex, offset: int = offset) -> Any:
                def f(a: Any, b: Any) -> Any:
                    y = ragged_dot(a, b, sizes, group_offset=offset, executor=ex)
                    return y.astype(jnp.float32).sum()

                return jax.value_and_grad(f, argnums=(0, 1))(a, b)

            def renumbered(_: Any, b: Any, a: Any, ex: Any = ex, mine: Any = mine) -> Any:
                def f(a: Any, b: Any) -> Any:
                    return ragged_dot(a, b, mine, executor=ex).astype(jnp.float32).sum()

                return jax.value_and_grad(f, argnums=(0, 1))(a, b)

            try:
                sessions = {
                    "offset": h.session(jax.jit(with_offset), sets),
                    "renumbered": h.session(jax.jit(renumbered), sets),
                }
                times = h.interleaved_times(sessions, rounds)
                row.offset_s, row.renumbered_s = times["offset"], times["renumbered"]
            except Exception as e:
                row.error = error_cell(e)
            print(f"  offset {shape} G_local {local} {impl}: {row.ratio}", file=sys.stderr)
    return out


def offset_table(rows: Sequence[OffsetRow]) -> str:
    lines = [["shape", "G_local", "impl", "offset µs", "renumbered µs", "renum ÷ offset"]]
    for r in rows:
        lines.append([
            r.shape, str(r.g_local), r.impl.replace("_", " "),
            r.error or ("-" if r.offset_s is None else f"{r.offset_s * 1e6:.0f}"),
            "-" if r.renumbered_s is None else f"{r.renumbered_s * 1e6:.0f}",
            "-" if r.ratio is None else f"{r.ratio:.3f}",
        ])  # fmt: skip
    return _format(lines)


# --- the command line ----------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, no tokamax (CPU test)")
    p.add_argument("--blocks", default="fine,coarse", help="blocks: fine, coarse")
    p.add_argument(
        "--gpus", default=None, help="GPU counts (default: 1, 2, 4 up to the local count)"
    )
    p.add_argument(
        "--dispatch", default="auto", choices=ep.DISPATCHES, help="the tokens' layout (below)"
    )
    p.add_argument("--capacity-factor", type=float, default=1.25, help="0: no capacity")
    p.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"interleaved rounds (default {ROUNDS})"
    )
    p.add_argument("--impls", default=",".join(IMPLS), help=f"subset of {IMPLS}")
    p.add_argument("--no-tune", action="store_true", help="skip kt tuned")
    p.add_argument("--tune-budget", type=float, default=8.0, help="tuner seconds per key")
    p.add_argument("--no-tokamax", action="store_true", help="do not import tokamax")
    p.add_argument("--offset-only", action="store_true", help="part 2 alone")
    p.add_argument("--no-offset", action="store_true", help="part 1 alone")
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    p.add_argument(
        "--kernels", action="store_true", help="print each step's longest kernels (GPU, CUPTI)"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    local = len(jax.local_devices())
    counts = (
        [int(c) for c in args.gpus.split(",")]
        if args.gpus
        else [c for c in (1, 2, 4) if c <= local]
    )
    if max(counts) > local:
        raise SystemExit(f"--gpus {args.gpus}: this process sees {local} device(s).")
    tokamax = None if args.smoke or args.no_tokamax else mb.import_tokamax()
    tuning = None if args.no_tune else op_bench.tuning_executor(args.tune_budget, shipped=True)
    factor = None if not args.capacity_factor else args.capacity_factor
    cfg = ep.EPConfig(data=None, dispatch=args.dispatch, capacity_factor=factor)
    blocks = SMOKE_BLOCKS if args.smoke else {b: BLOCKS[b] for b in args.blocks.split(",")}
    wanted = set(args.impls.split(","))
    block_results: list[BlockRow] = []
    if not args.offset_only:
        impls = {k: v for k, v in namespaces(tokamax, tuning).items() if k in wanted}
        for s in blocks.values():
            for n in counts:
                if s.experts % n:
                    print(
                        f"  {s.name} x{n}: {n} does not divide {s.experts} experts", file=sys.stderr
                    )
                    continue
                rows = block_rows(s, n, cfg, impls, args.rounds, args.kernels)
                block_results += rows
                # Each GPU count's rows as soon as they are timed (a run stopped part
                # way keeps them), and the JSON so far.
                print(block_table(rows), file=sys.stderr, flush=True)
                if args.json:
                    _write(args.json, _document(argv, local, tokamax, block_results, []))
        add_efficiency(block_results)
        print(f"Expert-parallel block, weak scaling ({jax.devices()[0].device_kind}):")
        print(block_table(block_results))
    offsets: list[OffsetRow] = []
    if not args.no_offset:
        cases = SMOKE_OFFSET_CASES if args.smoke else OFFSET_CASES
        offsets = [r for case in cases for r in offset_rows(case, tuning, args.rounds)]
        print("\nragged_dot forward + backward, group_offset against renumbered groups:")
        print(offset_table(offsets))
    doc = _document(argv, local, tokamax, block_results, offsets)
    if args.json:
        _write(args.json, doc)
    return doc


def _write(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def _document(
    argv: Sequence[str] | None,
    local: int,
    tokamax: Any,
    block_results: Sequence[BlockRow],
    offsets: Sequence[OffsetRow],
) -> dict[str, Any]:
    return {
        "device": jax.devices()[0].device_kind,
        "devices": local,
        "jax": jax.__version__,
        "tokamax": getattr(tokamax, "__version__", None),
        "command": " ".join(["python -m benchmarks.expert_parallel_gpu", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d"),
        "block_timer": "wall clock, bursts of steps",
        "offset_timer": "cupti" if h.on_gpu() else "wallclock",
        "blocks": [dataclasses.asdict(r) | {"tokens_per_s": r.tokens_per_s} for r in block_results],
        "offset": [dataclasses.asdict(r) | {"ratio": r.ratio} for r in offsets],
    }


if __name__ == "__main__":
    main()
