"""The first call at shapes in no shipped table: the regret of the predicted config and
of the first call's budgeted tuning against a full search, and what the first call
costs, on this GPU.

Every row is an op at a shape that neither shipped table holds and that the
prediction's weights were not chosen on (`benchmarks/prediction_regret.py` is the
leave-one-out over the tables' own keys). For each row, in this process:

1. **first call**: a fresh selector chain as the default executor builds it (memory
   cache, the shipped tables, `AutotunePolicy.from_env()`: the first-call budget of the
   `KERNELTUNE_FIRST_CALL_*` options) runs the call; its wall time (tracing, predicting,
   tuning, compiling, running) and the config it chose: tuned under the budget,
   predicted untimed, or answered by the tables (`NearShipped`);
2. **predicted**: the same with `FirstCallBudget(candidates=0)`: the config the
   prediction alone gives, untimed;
3. **full search**: a chain with no tables and no budget times every candidate
   (`Tuner(strategy="exhaustive")`, CUPTI on a GPU): the reference, and its wall time.

A regret is the full search's time of a config over its fastest time, minus 1
("failed": the config failed in the full search). The grouped matmul's held-out
shapes (`RAGGED`) are none of the tables' (`tools/ship_tables.py`'s `RAGGED` grid, 8-256
experts; a test checks that they stay apart).

    python -m benchmarks.first_call_gpu                          # every op (tens of minutes)
    python -m benchmarks.first_call_gpu --ops ragged_dot,matmul --json first_call.json
    python -m benchmarks.first_call_gpu --ops ragged_dot,attention --grad  # backward keys too
    python -m benchmarks.first_call_gpu --ops moe,loss_head,block   # model pieces, trained
    python -m benchmarks.first_call_gpu --ops ragged_dot --grad --shapes 3,4,5  # some shapes
    python -m benchmarks.first_call_gpu --smoke                  # tiny shapes, any device

Run from the repository root. The rows run one after another in one process, each
with its own chains and no persistent cache (`KERNELTUNE_CACHE_DIR` is not read).
Every first call is a user's: a fresh `jax.jit` of the row's step, lowered (tracing,
and in kerneltune's so choosing and tuning its configs), compiled and run once.
kerneltune's goes first, then the peers a user has for the row (plain JAX, cuDNN
through `jax.nn`, tokamax where installed): a later program may reuse XLA's autotuning
of an earlier one's matmuls, so this order favours the peers (`first_call_breakdown.py`
runs each first call in a fresh process instead, split into lowering and compile).
The summary gives kerneltune's first call over the fastest peer's and its compiled
program's memory (arguments, outputs, temporaries; tuning's own buffers are not in
it) over the smallest peer's (issue 45's bars: 1.5x and 1.1x).

The model pieces (`moe`: `examples/moe`'s block; `loss_head`: the loss head;
`block`: a Llama-class block from `benchmarks/model_blocks.py`) are always timed as
training steps (the gradient of their loss with respect to every float input).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
from benchmarks import harness as h
from benchmarks import loss_head_gpu
from benchmarks import model_blocks as mb
from examples.moe import model as moe_model
from kerneltune._src.caching.shipped import package_tables
from kerneltune._src.cli.demo_measure import program_peak
from kerneltune._src.selection.prediction import config_id
from kerneltune.kernels.ragged_dot import shapes as ragged_shapes
from kerneltune.kernels.ragged_dot import tokamax_backend as ragged_tokamax

#: A row's first call on an executor; returns its compiled program's memory in bytes.
Call = Callable[[kt.Executor], "int | None"]

#: Shapes in no shipped table (their grids: `tools/ship_tables.py`).
MATMUL = ((3072, 4096, 4096), (6144, 4096, 1024), (1536, 1024, 4096), (12288, 2048, 2048))
ROWS = ((8192, 3072), (2048, 6144), (12288, 1536), (6144, 12288))
#: (batch, sequence, heads, head dim, causal): 8k-18k tokens, none of the tables' T.
ATTENTION = ((6, 3072, 16, 128, True), (12, 1536, 16, 64, False), (3, 6144, 16, 128, False))
#: (m routed rows, k, n, experts): 8 to 256 experts, skewed routing, one empty expert.
RAGGED = (
    (32768, 2048, 768, 128),
    (16384, 2048, 1536, 32),
    (8192, 4096, 1024, 8),
    (65536, 1024, 512, 256),
    (24576, 2048, 768, 64),
    (12288, 1024, 2048, 16),
)
#: The MoE layer at two sizes no table holds: 16 experts top-2 (12288 routed rows of
#: 3072 -> 8192) and 48 experts top-6 (24576 routed rows of 2048 -> 1536).
MOE = (
    moe_model.MoEShape("held-out", 6144, 3072, 8192, 16, 2),
    moe_model.MoEShape("held-out", 4096, 2048, 1536, 48, 6),
)
#: (rows, width, vocabulary): GPT-2's padded vocabulary and Qwen's.
LOSS_HEAD = ((8192, 2048, 50304), (4096, 3072, 151936))
#: Llama-class blocks, head dim 128, grouped-query attention: none of the tables' sizes.
BLOCK = (mb.BlockShape(4, 4096, 2560, 20, 4, 6912), mb.BlockShape(2, 2048, 4096, 32, 8, 11008))
OPS = (
    "matmul", "layer_norm", "rms_norm", "softmax", "attention", "ragged_dot",
    "moe", "loss_head", "block",
)  # fmt: skip
#: Ops whose rows are training steps whatever `--grad` says.
TRAINED = ("moe", "loss_head", "block")
SMOKE: dict[str, Any] = {
    "matmul": ((64, 32, 48),),
    "rows": ((64, 96),),
    "attention": ((1, 64, 2, 16, True),),
    "ragged_dot": ((64, 32, 32, 4),),
    "moe": (moe_model.MoEShape("smoke", 32, 32, 32, 4, 2),),
    "loss_head": ((64, 32, 256),),
    "block": (mb.BlockShape(1, 64, 64, 4, 2, 96),),
}


Peers = dict[str, Callable[..., Any]]


def rows(op: str, smoke: bool) -> Iterator[tuple[str, Callable[..., Any], tuple[Any, ...], Peers]]:
    """(label, fn, args, peers) for each held-out shape of `op`: `fn(ex, *args)` calls
    it; each of `peers` (`peer(*args)`) is what a user would call instead: plain JAX
    (cuDNN where `jax.nn` uses it), and tokamax's grouped matmul where installed."""
    if op == "matmul":
        for m, k, n in SMOKE["matmul"] if smoke else MATMUL:

            def mm(ex: kt.Executor, a: Any, b: Any) -> Any:
                return kt.kernels.matmul(a, b, executor=ex)

            args = (h.normal(0, (m, k)), h.normal(1, (k, n)))
            yield f"{m}x{k}x{n}", mm, args, {"plain": jnp.matmul}
    elif op in ("layer_norm", "rms_norm", "softmax"):
        op_fn = getattr(kt.kernels, op)
        plain = {"softmax": jax.nn.softmax}.get(op)  # the norms have no plain JAX op
        for r, w in SMOKE["rows"] if smoke else ROWS:

            def rowwise(ex: kt.Executor, x: Any, fn: Any = op_fn) -> Any:
                return fn(x, executor=ex)

            yield f"{r}x{w}", rowwise, (h.normal(0, (r, w)),), {"plain": plain} if plain else {}
    elif op == "attention":
        for b, t, n, d, causal in SMOKE["attention"] if smoke else ATTENTION:

            def attend(ex: kt.Executor, q: Any, k: Any, v: Any, causal: bool = causal) -> Any:
                return kt.kernels.attention(q, k, v, is_causal=causal, executor=ex)

            def plain_attention(q: Any, k: Any, v: Any, causal: bool = causal) -> Any:
                return jax.nn.dot_product_attention(q, k, v, is_causal=causal)

            qkv = tuple(h.normal(i, (b, t, n, d)) for i in range(3))
            label = f"B{b} T{t} N{n} H{d}{' causal' if causal else ''}"
            yield label, attend, qkv, {"plain": plain_attention}
    elif op == "ragged_dot":
        peers: Peers = {"plain": jax.lax.ragged_dot}
        tk = h.tokamax()
        if tk is not None:
            peers["tokamax"] = tk.ragged_dot
        for m, k, n, g in SMOKE["ragged_dot"] if smoke else RAGGED:

            def grouped(ex: kt.Executor, lhs: Any, rhs: Any, sizes: Any) -> Any:
                return kt.kernels.ragged_dot(lhs, rhs, sizes, executor=ex)

            sizes = jnp.asarray(ragged_shapes.skewed(m, g, empty=1), jnp.int32)
            args = (h.normal(0, (m, k)), h.normal(1, (g, k, n)), sizes)
            yield f"{m}x{k}x{n} E{g}", grouped, args, peers
    elif op == "moe":
        tk = h.tokamax()
        for shape in SMOKE["moe"] if smoke else MOE:
            params = moe_model.init_params(shape)
            x, target = moe_model.inputs(shape)

            def moe(ex: kt.Executor, p: Any, x: Any, y: Any, s: Any = shape) -> Any:
                return moe_model.loss_fn(moe_model.kerneltune_ops(ex), s)(p, x, y)

            peers = {"plain": moe_model.loss_fn(moe_model.jax_ops(), shape)}
            if tk is not None:
                peers["tokamax"] = moe_model.loss_fn(moe_model.tokamax_ops(tk), shape)
            yield str(shape), moe, (params, x, target), peers
    elif op == "loss_head":
        tk = h.tokamax()
        for rows_, width, vocab in SMOKE["loss_head"] if smoke else LOSS_HEAD:

            def head(ex: kt.Executor, x: Any, labels: Any, w: Any) -> Any:
                return kt.kernels.linear_softmax_cross_entropy(x, labels, w, executor=ex)

            labels = jax.random.randint(jax.random.key(2), (rows_,), 0, vocab, jnp.int32)
            args = (h.normal(0, (rows_, width)), labels, h.normal(1, (width, vocab)) * 0.02)
            peers = {"plain": loss_head_gpu.plain_loss_bf16_logits}
            if tk is not None:
                peers["tokamax"] = loss_head_gpu.tokamax_loss(tk)
            yield f"{rows_}x{width}->{vocab}", head, args, peers
    elif op == "block":
        tk = h.tokamax()
        for shape in SMOKE["block"] if smoke else BLOCK:
            params, x = mb.block_inputs("llama", shape)

            def block(ex: kt.Executor, p: Any, x: Any, s: Any = shape) -> Any:
                return mb.llama_block(mb.kerneltune_ops(ex), p, x, s)

            peers = {"plain": functools.partial(_llama_with, mb.plain_ops(), shape)}
            if tk is not None:
                peers["tokamax"] = functools.partial(_llama_with, mb.tokamax_ops(tk), shape)
            yield f"llama {shape}", block, (params, x), peers
    else:
        raise SystemExit(f"--ops: unknown op {op!r}; known: {', '.join(OPS)}")


def _llama_with(ops: mb.Ops, shape: mb.BlockShape, p: Any, x: Any) -> Any:
    return mb.llama_block(ops, p, x, shape)


def _loss_over_floats(
    fn: Callable[..., Any], args: tuple[Any, ...]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The sum of `fn(*args)`'s output as a function of the float arrays in `args`
    (pytrees of arrays), and those arrays."""
    leaves, tree = jax.tree.flatten(args)
    floats = tuple(i for i, a in enumerate(leaves) if jnp.issubdtype(a.dtype, jnp.floating))

    def loss(*wrt: Any) -> Any:
        full = list(leaves)
        for i, a in zip(floats, wrt, strict=True):
            full[i] = a
        return fn(*jax.tree.unflatten(tree, full)).astype(jnp.float32).sum()

    return loss, tuple(leaves[i] for i in floats)


def step_of(fn: Callable[..., Any], grad: bool) -> Callable[..., Any]:
    """`fn(*args)`, or (`grad`) the gradient of the sum of its output with respect to
    every float array of `args`, so the backward kernels' keys are chosen too."""
    if not grad:
        return fn

    def step(*args: Any) -> Any:
        loss, wrt = _loss_over_floats(fn, args)
        return jax.grad(loss, argnums=tuple(range(len(wrt))))(*wrt)

    return step


def first_call(step: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, int | None]:
    """A user's first call of `step` on `args`: a fresh `jax.jit`, lowered, compiled
    and run once. Returns the result and the compiled program's memory (arguments,
    outputs, temporaries; None where the platform does not say)."""
    compiled = jax.jit(step).lower(*args).compile()
    return jax.block_until_ready(compiled(*args)), program_peak(compiled)


def as_call(fn: Callable[..., Any], args: tuple[Any, ...], grad: bool) -> Call:
    """The row's first call on an executor, as a user's jitted step makes it: returns
    the compiled program's memory (`first_call`)."""
    return lambda ex: first_call(step_of(functools.partial(fn, ex), grad), args)[1]


def peer_first_calls(
    peers: Peers, args: tuple[Any, ...], grad: bool
) -> tuple[dict[str, Any], dict[str, int | None]]:
    """Each peer's first call, as a user's jitted step makes it (`first_call`): its
    seconds (tracing, compiling, any autotuning of its own, one run), or the error of
    a peer that fails; and its compiled program's memory."""
    seconds: dict[str, Any] = {}
    peaks: dict[str, int | None] = {}
    for name, peer in peers.items():
        start = time.perf_counter()
        try:
            _, peaks[name] = first_call(step_of(peer, grad), args)
            seconds[name] = time.perf_counter() - start
        except Exception as e:  # a peer that cannot run the call is data
            seconds[name] = f"failed: {h.error_text(e)}"
    return seconds, peaks


@dataclasses.dataclass
class Run:
    """What one chain did for a row: the configs it chose by key, how, and the wall."""

    wall_s: float = 0.0
    peak_bytes: int | None = None
    chosen: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)
    how: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    reports: dict[tuple[str, str], kt.TuningReport] = dataclasses.field(default_factory=dict)
    error: str | None = None


def run(call: Call, policy: kt.AutotunePolicy, *, shipped: bool, tuner: Any = None) -> Run:
    out = Run()

    def on_event(event: str, **data: Any) -> None:
        key = (data["op_id"], data["call_key"])
        if event == "autotune_finish":
            out.reports[key] = data["report"]
            out.chosen[key], out.how[key] = data["cfg"], "tuned"
        elif event == "predicted":
            out.chosen[key], out.how[key] = data["cfg"], "predicted"
        elif event in ("cache_hit", "heuristics") and key not in out.chosen:
            out.chosen[key], out.how[key] = data["cfg"], data.get("level", event)

    chain: kt.ConfigSelectorChain[Any, Any] = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=policy,
        tuner=tuner,
        shipped=package_tables() if shipped else None,
        on_event=on_event,
    )
    start = time.perf_counter()
    try:
        out.peak_bytes = call(kt.Executor(chain))
    except Exception as e:  # one failing row keeps the others
        out.error = h.error_text(e)
    out.wall_s = time.perf_counter() - start
    for key, report in out.reports.items():
        if report.budgeted:
            out.how[key] = "budgeted"
    return out


def regret(full: kt.TuningReport | None, cfg: Any) -> float | None:
    """`cfg`'s time in the full search over the fastest there, minus 1; inf: it failed
    there; None: no full search."""
    if full is None or cfg is None:
        return None
    times = {config_id(c.cfg): c.time_s for c in full.candidates}
    best = min((t for t in times.values() if t is not None), default=None)
    t = times.get(config_id(cfg))
    if best is None:
        return None
    return float("inf") if t is None else t / best - 1


def _id(cfg: Any) -> str | None:
    return None if cfg is None else config_id(cfg)


def _outcomes(report: kt.TuningReport | None) -> list[dict[str, Any]]:
    """Each candidate a tuning reported (a budgeted first call's: its shortlist): its
    config's id, time and status."""
    if report is None:
        return []
    return [
        {"cfg": config_id(c.cfg), "time_s": c.time_s, "status": c.status} for c in report.candidates
    ]


def measure(
    op: str,
    label: str,
    call: Call,
    peers: Callable[[], tuple[dict[str, Any], dict[str, int | None]]] = lambda: ({}, {}),
) -> list[dict[str, Any]]:
    """The row's first call with the default policy, then `peers()`' first calls, then
    the prediction alone and a full search, each on a fresh chain."""
    first = run(call, kt.AutotunePolicy.from_env(), shipped=True)
    peers_first_s, peer_peaks = peers()
    predicted = run(call, kt.AutotunePolicy(budget=kt.FirstCallBudget(candidates=0)), shipped=True)
    full = run(
        call,
        kt.AutotunePolicy(),
        shipped=False,
        tuner=kt.Tuner(strategy="exhaustive", progress=False),
    )
    out = []
    for key, report in full.reports.items():
        out.append(
            {
                "op": op,
                "key": key[0],
                "shape": label,
                "first_call_s": first.wall_s,
                "first_call_how": first.how.get(key),
                # The prediction's call, after the first call and the peers' (so XLA's
                # and the kernels' in-process caches may flatter it).
                "predicted_call_s": predicted.wall_s,
                "first_call_peak_bytes": first.peak_bytes,
                # The whole call's first call: the key's share is not apart from the rest.
                "peer_first_call_s": dict(peers_first_s),
                "peer_peak_bytes": dict(peer_peaks),
                "full_search_s": full.wall_s,
                "full_timer": report.timer,
                "full_timer_note": report.timer_note,
                # What an offline replay of the prediction needs: every candidate's time
                # in the full search, and the configs each chain chose.
                "candidates": _outcomes(report),
                "chosen": {
                    "predicted": _id(predicted.chosen.get(key)),
                    "first call": _id(first.chosen.get(key)),
                    "heuristic": _id(report.heuristic_cfg),
                },
                "first_call_timed": _outcomes(first.reports.get(key)),
                "regret": {
                    "predicted": regret(report, predicted.chosen.get(key)),
                    "first call": regret(report, first.chosen.get(key)),
                    "heuristic": regret(report, report.heuristic_cfg),
                },
                "errors": {
                    name: r.error
                    for name, r in (("first", first), ("predicted", predicted), ("full", full))
                    if r.error
                },
            }
        )
    if not out:  # nothing was tuned: no candidates here, or the call failed
        errors = {"first": first.error, "predicted": predicted.error, "full": full.error}
        errors = {k: v for k, v in errors.items() if v}
        how = ", ".join(f"{k[0]}: {v}" for k, v in full.how.items()) or "no kerneltune call"
        out.append(
            {
                "op": op,
                "key": None,
                "shape": label,
                "errors": errors,
                "regret": {},
                "note": how,
                "first_call_s": first.wall_s,
                "first_call_peak_bytes": first.peak_bytes,
                "peer_first_call_s": dict(peers_first_s),
                "peer_peak_bytes": dict(peer_peaks),
            }
        )
    return out


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    return "failed" if x == float("inf") else f"{x:.1%}"


def summary(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| op | shapes | predicted: median / worst | first call: median / worst | "
        "heuristic: median / worst | first call s: median / worst | "
        "first call ÷ best peer's: median / worst | memory ÷ smallest peer's: median / worst | "
        "full search s: median |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r.get("key"):
            by_key.setdefault(r["key"], []).append(r)
    for key, group in sorted(by_key.items()):
        cells = []
        for m in ("predicted", "first call", "heuristic"):
            vals = [g["regret"][m] for g in group if g["regret"].get(m) is not None]
            cells.append(
                f"{_pct(statistics.median(vals))} / {_pct(max(vals))}" if vals else "- / -"
            )
        first = [g["first_call_s"] for g in group]
        full = [g["full_search_s"] for g in group]
        ratios = [r for r in map(over_best_peer, group) if r is not None]
        memory = [r for r in map(memory_over_peer, group) if r is not None]
        lines.append(
            f"| {key} | {len(group)} | {' | '.join(cells)} | "
            f"{statistics.median(first):.1f} / {max(first):.1f} | {_ratios(ratios)} | "
            f"{_ratios(memory)} | {statistics.median(full):.1f} |"
        )
    return "\n".join(lines)


def _ratios(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f}x / {max(values):.2f}x" if values else "-"


def memory_over_peer(row: dict[str, Any]) -> float | None:
    """The row's compiled memory over the smallest peer's (None: not known)."""
    peaks = [b for b in row.get("peer_peak_bytes", {}).values() if b]
    mine = row.get("first_call_peak_bytes")
    return mine / min(peaks) if peaks and mine else None


def over_best_peer(row: dict[str, Any]) -> float | None:
    """The row's first call over the fastest peer's first call (None: no peer ran)."""
    times = [t for t in row.get("peer_first_call_s", {}).values() if isinstance(t, float)]
    return row["first_call_s"] / min(times) if times and min(times) > 0 else None


def _bytes(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def _memory_text(row: dict[str, Any]) -> str:
    mine = row.get("first_call_peak_bytes")
    parts = [f"kt {_bytes(mine)}"] if mine else []
    parts += [f"{n} {_bytes(b)}" for n, b in row.get("peer_peak_bytes", {}).items() if b]
    return "memory " + ", ".join(parts) if parts else "memory -"


def _peers_text(peers: dict[str, Any]) -> str:
    if not peers:
        return "no peer"
    return ", ".join(
        f"{name} {t:.1f} s" if isinstance(t, float) else f"{name} {t}" for name, t in peers.items()
    )


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated of {OPS}")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the rows here")
    p.add_argument("--smoke", action="store_true", help="tiny shapes: a check of the script")
    p.add_argument(
        "--grad", action="store_true", help="forward + backward: the backward kernels' keys too"
    )
    p.add_argument(
        "--shapes",
        default=None,
        help="comma-separated indices of each op's shapes to run (0-based; default: all)",
    )
    args = p.parse_args(argv)
    picked = None if args.shapes is None else {int(i) for i in args.shapes.split(",")}
    if not h.on_gpu() and not args.smoke:
        print("first_call_gpu: no GPU found (use --smoke to check the script on a CPU).")
        return []
    device = jax.devices()[0].device_kind
    # Whether the grouped matmul offers tokamax's kernel (whose autotuning can take
    # CUPTI from the full search), as the op itself decides it.
    with_tokamax = "installed" if ragged_tokamax.installed() else "not installed"
    print(
        f"{device}, jax {jax.__version__}, tokamax {with_tokamax}, "
        f"budget {kt.AutotunePolicy.from_env().budget}"
    )
    results: list[dict[str, Any]] = []
    for op in args.ops.split(","):
        grad = args.grad or op in TRAINED
        for i, (label, fn, fn_args, peers) in enumerate(rows(op, args.smoke)):
            if picked is not None and i not in picked:
                continue
            peer_calls = functools.partial(peer_first_calls, peers, fn_args, grad)
            for r in measure(op, label, as_call(fn, fn_args, grad), peer_calls):
                results.append(r)
                reg = r["regret"]
                print(
                    f"{op:10s} {label:24s} {r.get('key') or '-':22s} "
                    f"first {r.get('first_call_s', 0):6.1f} s ({r.get('first_call_how')}; "
                    f"{_peers_text(r.get('peer_first_call_s', {}))}; "
                    f"{_memory_text(r)}), "
                    f"predicted untimed {r.get('predicted_call_s', 0):.1f} s, "
                    f"full {r.get('full_search_s', 0):6.1f} s; regret predicted "
                    f"{_pct(reg.get('predicted'))}, first call {_pct(reg.get('first call'))}, "
                    f"heuristic {_pct(reg.get('heuristic'))}"
                    + (f"  ({r['note']})" if r.get("note") else "")
                    + (f"  ERRORS {r['errors']}" if r.get("errors") else ""),
                    flush=True,
                )
            _save(args.json, device, with_tokamax, results)
    print(summary(results))
    return results


def _save(path: str | None, device: str, with_tokamax: str, results: list[dict[str, Any]]) -> None:
    """Writes the rows so far (after each row: a run stopped at a device's time limit
    keeps what it measured), through a temporary file so a stop never leaves half a file."""
    if not path:
        return
    doc = {"device": device, "jax": jax.__version__, "tokamax": with_tokamax, "rows": results}
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
