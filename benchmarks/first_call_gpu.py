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
    python -m benchmarks.first_call_gpu --smoke                  # tiny shapes, any device

Run from the repository root. The rows run one after another in one process, each
with its own chains and no persistent cache (`KERNELTUNE_CACHE_DIR` is not read).
Before each row, the peers a user has for it (plain JAX, cuDNN through `jax.nn`,
tokamax's grouped matmul where installed) make their first call from a fresh `jax.jit`;
the summary gives kerneltune's first call over the fastest peer's (issue 45's bar is
1.5x).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
from benchmarks import harness as h
from kerneltune._src.caching.shipped import package_tables
from kerneltune._src.selection.prediction import config_id
from kerneltune.kernels.ragged_dot import shapes as ragged_shapes
from kerneltune.kernels.ragged_dot import tokamax_backend as ragged_tokamax

Call = Callable[[kt.Executor], Any]

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
OPS = ("matmul", "layer_norm", "rms_norm", "softmax", "attention", "ragged_dot")
SMOKE = {
    "matmul": ((64, 32, 48),),
    "rows": ((64, 96),),
    "attention": ((1, 64, 2, 16, True),),
    "ragged_dot": ((64, 32, 32, 4),),
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
        if ragged_tokamax.installed():
            peers["tokamax"] = importlib.import_module("tokamax").ragged_dot
        for m, k, n, g in SMOKE["ragged_dot"] if smoke else RAGGED:

            def grouped(ex: kt.Executor, lhs: Any, rhs: Any, sizes: Any) -> Any:
                return kt.kernels.ragged_dot(lhs, rhs, sizes, executor=ex)

            sizes = jnp.asarray(ragged_shapes.skewed(m, g, empty=1), jnp.int32)
            args = (h.normal(0, (m, k)), h.normal(1, (g, k, n)), sizes)
            yield f"{m}x{k}x{n} E{g}", grouped, args, peers
    else:
        raise SystemExit(f"--ops: unknown op {op!r}; known: {', '.join(OPS)}")


def _loss_over_floats(
    fn: Callable[..., Any], args: tuple[Any, ...]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The sum of `fn(*args)`'s output as a function of `args`' float inputs, and
    those inputs."""
    floats = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))

    def loss(*wrt: Any) -> Any:
        full = list(args)
        for i, a in zip(floats, wrt, strict=True):
            full[i] = a
        return fn(*full).astype(jnp.float32).sum()

    return loss, tuple(args[i] for i in floats)


def as_call(fn: Callable[..., Any], args: tuple[Any, ...], grad: bool) -> Call:
    """The row's call on an executor: forward, or (`grad`) the gradient of the sum of
    its output with respect to every float input, so the backward kernels' keys are
    chosen too."""
    if not grad:
        return lambda ex: fn(ex, *args)

    def step(ex: kt.Executor) -> Any:
        loss, wrt = _loss_over_floats(lambda *a: fn(ex, *a), args)
        return jax.grad(loss, argnums=tuple(range(len(wrt))))(*wrt)

    return step


def peer_first_calls(peers: Peers, args: tuple[Any, ...], grad: bool) -> dict[str, Any]:
    """Each peer's first call, as a user's jitted step makes it: seconds from a fresh
    `jax.jit` to the result (tracing, compiling, any autotuning of its own, one run);
    a peer that fails gives its error."""
    out: dict[str, Any] = {}
    for name, peer in peers.items():
        if grad:
            loss, wrt = _loss_over_floats(peer, args)
            step, step_args = jax.jit(jax.grad(loss, argnums=tuple(range(len(wrt))))), wrt
        else:
            step, step_args = jax.jit(peer), args
        start = time.perf_counter()
        try:
            jax.block_until_ready(step(*step_args))
            out[name] = time.perf_counter() - start
        except Exception as e:  # a peer that cannot run the call is data
            out[name] = f"failed: {h.error_text(e)}"
    return out


@dataclasses.dataclass
class Run:
    """What one chain did for a row: the configs it chose by key, how, and the wall."""

    wall_s: float = 0.0
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
        jax.block_until_ready(call(kt.Executor(chain)))
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
    op: str, label: str, call: Call, peers_first_s: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    first = run(call, kt.AutotunePolicy.from_env(), shipped=True)
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
                # The whole call's first call: the key's share is not apart from the rest.
                "peer_first_call_s": dict(peers_first_s or {}),
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
                "peer_first_call_s": dict(peers_first_s or {}),
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
        "first call ÷ best peer's: median / worst | full search s: median |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
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
        ratio = f"{statistics.median(ratios):.2f}x / {max(ratios):.2f}x" if ratios else "-"
        lines.append(
            f"| {key} | {len(group)} | {' | '.join(cells)} | "
            f"{statistics.median(first):.1f} / {max(first):.1f} | {ratio} | "
            f"{statistics.median(full):.1f} |"
        )
    return "\n".join(lines)


def over_best_peer(row: dict[str, Any]) -> float | None:
    """The row's first call over the fastest peer's first call (None: no peer ran)."""
    times = [t for t in row.get("peer_first_call_s", {}).values() if isinstance(t, float)]
    return row["first_call_s"] / min(times) if times and min(times) > 0 else None


def _peers_text(peers: dict[str, Any]) -> str:
    if not peers:
        return "no peer"
    return ", ".join(
        f"{name} {t:.1f} s" if isinstance(t, float) else f"{name} {t}" for name, t in peers.items()
    )


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--json", default=None)
    p.add_argument("--smoke", action="store_true", help="tiny shapes: a check of the script")
    p.add_argument(
        "--grad", action="store_true", help="forward + backward: the backward kernels' keys too"
    )
    args = p.parse_args(argv)
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
        for label, fn, fn_args, peers in rows(op, args.smoke):
            # The peers first, as a user would have met them before trying kerneltune.
            peers_s = peer_first_calls(peers, fn_args, args.grad)
            for r in measure(op, label, as_call(fn, fn_args, args.grad), peers_s):
                results.append(r)
                reg = r["regret"]
                print(
                    f"{op:10s} {label:24s} {r.get('key') or '-':22s} "
                    f"first {r.get('first_call_s', 0):6.1f} s ({r.get('first_call_how')}; "
                    f"{_peers_text(r.get('peer_first_call_s', {}))}), "
                    f"full {r.get('full_search_s', 0):6.1f} s; regret predicted "
                    f"{_pct(reg.get('predicted'))}, first call {_pct(reg.get('first call'))}, "
                    f"heuristic {_pct(reg.get('heuristic'))}"
                    + (f"  ({r['note']})" if r.get("note") else "")
                    + (f"  ERRORS {r['errors']}" if r.get("errors") else ""),
                    flush=True,
                )
    print(summary(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": device,
                    "jax": jax.__version__,
                    "tokamax": with_tokamax,
                    "rows": results,
                },
                f,
                indent=1,
            )
    return results


if __name__ == "__main__":
    main()
