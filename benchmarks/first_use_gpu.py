"""What a user feels the first time kerneltune's ops run at real sizes: the first call's
wall (tracing, tuning, compiling), the peak device memory of the process (tuning
included) and the step time, against plain JAX (cuDNN attention, XLA elsewhere).

    python -m benchmarks.first_use_gpu [--rows gpt,llama,...] [--variants plain,kt,kt_cold]
    python -m benchmarks.first_use_gpu --rows gpt_off --variants plain_labelled  # a control
    python -m benchmarks.first_use_gpu --rows gpt --variants plain,kt --repeat 5  # medians
    FIRST_USE_TRACE=1 python -m benchmarks.first_use_gpu ...   # also each tuned key's cost

Run from the repository root on a GPU. Every (row, variant) runs in a fresh process, so
its first call and its peak memory are its own: "kt" runs kerneltune's ops through the
default executor with an empty cache directory and the shipped tables on, "kt_cold"
with them off (`KERNELTUNE_SHIPPED=0`). The kerneltune processes then time their step
against plain JAX's in interleaved rounds (CUPTI device time), so "× plain" is a ratio
measured in one process; plain's step is compiled twice there, and "plain again" (the
ratio of the two, the same program) shows how far apart identical programs time in that
process. "consts" counts JAX's "constants were captured" warnings.

Rows: the GPT and Llama blocks of `model_gpu` (shapes in the shipped tables), the same
blocks at sizes in no table ("_off", "llama_off2"), causal grouped-query attention
forward + backward at 32k, 64k and 128k tokens (B1, 16/4 heads, head dim 128, bf16),
the MoE layer of `examples/moe` at two sizes in no table ("moe_off16": 16 experts
top-2, D 3072, F 8192; "moe_off48": 48 experts top-6, D 2048, F 1536) and the loss
head's training step at two vocabularies in no table ("head_50k": 8192x2048 -> 50304;
"head_152k": 4096x3072 -> 151936; plain JAX with logits in bf16). The MoE and loss
head processes time tokamax's step too where it is installed ("× tokamax").

Variants: "plain" (plain JAX), "kt" and "kt_cold" (above), "tokamax" (the MoE layer on
tokamax's grouped matmul, the blocks and the loss head on tokamax's ops), and "kt_autotuned": kerneltune's
first call, then `kt.autotune(step, ...)` (its wall: "autotune s", issue 45's 30 s), then the step as a
new `jax.jit` traces it with the tuned configs: the step time is the tuned one's.

    python -m benchmarks.first_use_gpu --rows moe_off16,moe_off48 --variants tokamax,kt,kt_autotuned
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import fresh_process, loss_head_gpu
from benchmarks import harness as h
from benchmarks import model_blocks as mb
from examples.moe import model as moe_model

BLOCKS = {
    "gpt": ("gpt", mb.BlockShape(batch=8, seq=2048, dim=2048, heads=16, kv_heads=16, hidden=8192)),
    "llama": ("llama", mb.BlockShape(8, 2048, 2048, 16, 4, 5632)),
    # Batch and sequence in no shipped table.
    "gpt_off": ("gpt", mb.BlockShape(6, 3072, 2048, 16, 16, 8192)),
    "llama_off": ("llama", mb.BlockShape(4, 4096, 2048, 16, 4, 5632)),
    # `first_call_gpu.BLOCK`'s second: D 4096, 32/8 heads, MLP 11008.
    "llama_off2": ("llama", mb.BlockShape(2, 2048, 4096, 32, 8, 11008)),
}
#: The loss head (rows x width -> vocabulary) at `first_call_gpu.LOSS_HEAD`'s sizes:
#: GPT-2's vocabulary and Qwen's, in no shipped table.
HEADS = {"head_50k": (8192, 2048, 50304), "head_152k": (4096, 3072, 151936)}
LONG = {"attn32k": 32768, "attn64k": 65536, "attn128k": 131072}
#: The MoE layer at sizes no shipped table holds (`first_call_gpu.MOE`'s).
MOE = {
    "moe_off16": moe_model.MoEShape("held-out", 6144, 3072, 8192, 16, 2),
    "moe_off48": moe_model.MoEShape("held-out", 4096, 2048, 1536, 48, 6),
}
ROWS = (*BLOCKS, *LONG, *MOE, *HEADS)
# Tiny rows that run anywhere (a check of the benchmark itself, wall clock on a CPU).
SMOKE_BLOCKS = {"gpt_smoke": ("gpt", mb.BlockShape(1, 64, 64, 2, 2, 128))}
SMOKE_LONG = {"attn_smoke": 64}
SMOKE_MOE = {"moe_smoke": moe_model.MoEShape("smoke", 32, 32, 32, 4, 2)}
SMOKE_HEADS = {"head_smoke": (64, 32, 256)}
# "plain_labelled": plain JAX's ops with kerneltune's labels on their instructions (a
# control: the step of the same program, labelled, against plain's in one process).
VARIANTS = ("plain", "kt", "kt_cold", "plain_labelled", "tokamax", "kt_autotuned")
ROUNDS = 5


def _attention_step(impl: Callable[..., jax.Array]) -> Callable[..., Any]:
    def loss(q: jax.Array, k: jax.Array, v: jax.Array, do: jax.Array) -> jax.Array:
        return jnp.vdot(impl(q, k, v).astype(jnp.float32), do.astype(jnp.float32))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _plain_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    implementation = "cudnn" if h.on_gpu() else None
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)


def _kt_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    from kerneltune.kernels import attention

    return attention(q, k, v, is_causal=True)


def _kt_loss_head(x: jax.Array, labels: jax.Array, w: jax.Array) -> jax.Array:
    from kerneltune.kernels import linear_softmax_cross_entropy

    return linear_softmax_cross_entropy(x, labels, w)


def _tokamax() -> Any:
    tk = h.tokamax()
    if tk is None:
        raise SystemExit("the tokamax variant needs tokamax installed")
    return tk


def step_for(row: str, variant: str) -> Callable[..., Any]:
    """The row's jitted training step with the variant's ops (a new jit each call)."""
    plain = variant in ("plain", "plain_labelled")
    if row in {**HEADS, **SMOKE_HEADS}:
        if variant == "tokamax":
            loss = loss_head_gpu.tokamax_loss(_tokamax())
        else:
            loss = loss_head_gpu.plain_loss_bf16_logits if plain else _kt_loss_head
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 2)))
    moes = {**MOE, **SMOKE_MOE}
    if row in moes:
        if variant == "tokamax":
            ops = moe_model.tokamax_ops(_tokamax())
        else:
            ops = moe_model.jax_ops() if plain else moe_model.kerneltune_ops()
        return jax.jit(jax.value_and_grad(moe_model.loss_fn(ops, moes[row])))
    blocks = {**BLOCKS, **SMOKE_BLOCKS}
    if variant == "tokamax" and row not in blocks:
        raise SystemExit(
            f"the tokamax variant is for the MoE rows, the blocks and the loss heads, not {row}"
        )
    if row in blocks:
        block, shape = blocks[row]
        ops = mb.plain_ops() if plain else mb.kerneltune_ops()
        if variant == "tokamax":
            ops = mb.tokamax_ops(_tokamax())
        if variant == "plain_labelled":
            ops = mb.labelled_ops(ops)
        return mb.train_step(block, ops, shape)
    attention = _plain_attention if plain else _kt_attention
    if variant == "plain_labelled":
        import kerneltune

        attention = kerneltune.label("plain.attention")(attention)
    return _attention_step(attention)


def args_for(row: str) -> tuple[Any, ...]:
    """The row's inputs, on the device (every variant of a row takes the same)."""
    moes = {**MOE, **SMOKE_MOE}
    if row in moes:
        return (moe_model.init_params(moes[row]), *moe_model.inputs(moes[row]))
    heads = {**HEADS, **SMOKE_HEADS}
    if row in heads:
        rows, width, vocab = heads[row]
        labels = jax.random.randint(jax.random.key(2), (rows,), 0, vocab, jnp.int32)
        return h.normal(0, (rows, width)), labels, h.normal(1, (width, vocab)) * 0.02
    blocks = {**BLOCKS, **SMOKE_BLOCKS}
    if row in blocks:
        block, shape = blocks[row]
        return mb.block_inputs(block, shape)
    t = {**LONG, **SMOKE_LONG}[row]
    q, do = (h.normal(s, (1, t, 16, 128)) for s in (0, 3))
    k, v = (h.normal(s, (1, t, 4, 128)) for s in (1, 2))
    return q, k, v, do


def step_and_args(row: str, variant: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return step_for(row, variant), args_for(row)


def trace_keys(device: Any, keys: list[dict[str, Any]]) -> None:
    """Has the default executor append, per tuned key, its op, signature, tuning wall
    and how far it raised the process's peak memory (where the first call's time and
    memory go)."""
    import kerneltune as kt

    chain = kt.default_executor().chooser
    started: dict[Any, tuple[float, int]] = {}
    inner = chain.on_event

    def on_event(event: str, **data: Any) -> None:
        if inner is not None:
            inner(event, **data)
        peak = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)
        key = data.get("call_key")
        if event == "autotune_start":
            started[key] = (time.perf_counter(), peak)
        elif event == "autotune_finish" and key in started:
            t0, peak0 = started.pop(key)
            report = data.get("report")
            cands = getattr(report, "candidates", ())
            keys.append(
                {
                    "op": data.get("op_id"),
                    "key": str(key)[:120],
                    "tune_s": round(time.perf_counter() - t0, 2),
                    "peak_gib": round(peak / 2**30, 2),
                    "raised_gib": round((peak - peak0) / 2**30, 2),
                    "candidates": len(cands),
                    "evaluated": sum(c.status != "pruned" for c in cands),
                    "timed": sum(c.time_s is not None for c in cands),
                    "strategy": getattr(report, "strategy", None),
                    "timer": getattr(report, "timer", None),
                    "timer_note": getattr(report, "timer_note", None),
                    "in_use_gib": round(
                        (device.memory_stats() or {}).get("bytes_in_use", 0) / 2**30, 2
                    ),
                    "evaluations": [
                        f"{str(c.cfg)[:60]} {c.status} lower {c.lower_s} compile {c.compile_s}"
                        f" time {c.time_s}"
                        for c in cands
                        if c.status != "pruned"
                    ],
                    "phases_s": {
                        k: round(v, 2) for k, v in (getattr(report, "phases_s", None) or {}).items()
                    },
                    "best": str(data.get("cfg"))[:100],
                }
            )

    chain.on_event = on_event


class RetriedSessions(logging.Handler):
    """Counts the CUPTI sessions run again because other threads launched kernels
    during them (kerneltune logs each at debug level)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def attach(self) -> None:
        log = logging.getLogger("kerneltune")
        log.setLevel(logging.DEBUG)
        log.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if "counted other launches" in record.getMessage():
            self.count += 1


def child(row: str, variant: str) -> dict[str, Any]:
    """One (row, variant) in this fresh process: first call, peak memory, step time."""
    device = jax.local_devices()[0]
    out: dict[str, Any] = {"row": row, "variant": variant, "device": device.device_kind}
    out["jax"] = jax.__version__
    retries = RetriedSessions()
    if variant != "plain" and os.environ.get("FIRST_USE_TRACE"):
        out["keys"] = []
        trace_keys(device, out["keys"])
        retries.attach()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step, args = step_and_args(row, variant)
        jax.block_until_ready(args)
        before = device.memory_stats() or {}
        out["inputs_gib"] = before.get("bytes_in_use", 0) / 2**30
        out["first_s"] = h.timed_first_call(step, args)
        stats = device.memory_stats() or {}
        out["peak_gib"] = stats.get("peak_bytes_in_use", 0) / 2**30
    out["consts"] = sum("constants were captured" in str(w.message) for w in caught)
    if variant == "kt_autotuned":
        import kerneltune as kt

        start = time.perf_counter()
        kt.autotune(step, *args)
        out["autotune_s"] = time.perf_counter() - start
        from kerneltune._src.tuning import lowering_pool

        out["lowered_by"] = dict(lowering_pool.lowered_by)  # worker processes or here
        step = step_for(row, variant)  # a new jit: traced with the tuned configs
        out["peak_gib"] = (device.memory_stats() or {}).get("peak_bytes_in_use", 0) / 2**30
    out["cupti_retries"] = retries.count  # in the first call and kt.autotune
    sessions = {variant: h.session(step, [args])}
    with_tokamax = {**MOE, **SMOKE_MOE, **HEADS, **SMOKE_HEADS}
    if row in with_tokamax and variant != "tokamax" and h.tokamax() is not None:
        sessions["tokamax"] = h.session(step_for(row, "tokamax"), [args])
    if variant != "plain":
        # Plain JAX's step timed in this process too, in interleaved rounds, and a
        # second compilation of it: the same program, so plain/plain_again is how far
        # apart two identical programs time in this process (the sample's noise floor).
        sessions["plain"] = h.session(step_for(row, "plain"), [args])
        sessions["plain_again"] = h.session(step_for(row, "plain"), [args])
    times = h.interleaved_times(sessions, rounds=ROUNDS)
    out["step_ms"] = times[variant] * 1e3
    if "plain" in times and variant != "plain":
        out["plain_step_ms"] = times["plain"] * 1e3
        out["plain_again_ms"] = times["plain_again"] * 1e3
    if "tokamax" in times and variant != "tokamax":
        out["tokamax_step_ms"] = times["tokamax"] * 1e3
    return out


def run_one(row: str, variant: str, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.first_use_gpu", "--child", row, variant]
    t0 = time.perf_counter()
    result = fresh_process.json_result(
        cmd, timeout_s=timeout_s, env={"KERNELTUNE_SHIPPED": "0"} if variant == "kt_cold" else None
    )
    if "error" in result:
        return {"row": row, "variant": variant, **result}
    result["process_s"] = time.perf_counter() - t0
    return result


def describe(rows: dict[str, dict[str, dict[str, Any]]], row: str) -> str:
    by = rows[row]
    plain = by.get("plain", {})
    cells = [row]
    for variant, r in by.items():
        if "error" in r:
            cells.append(f"{variant}: {r['error']}")
            continue
        text = (
            f"{variant}: step {r['step_ms']:.2f} ms, first {r['first_s']:.1f} s, "
            f"peak {r['peak_gib']:.2f} GiB, consts {r['consts']}"
        )
        if "autotune_s" in r:
            text += f", autotune {r['autotune_s']:.1f} s"
        if "tokamax_step_ms" in r:
            text += f", {r['tokamax_step_ms'] / r['step_ms']:.3f}× tokamax's step"
        if "plain_step_ms" in r:
            text += f", {r['plain_step_ms'] / r['step_ms']:.3f}× plain's step (same process"
            if "plain_again_ms" in r:  # plain's program compiled twice: the noise floor
                text += f"; plain again {r['plain_step_ms'] / r['plain_again_ms']:.3f}×"
            text += ")"
        if variant != "plain" and "first_s" in plain:
            text += (
                f", first {r['first_s'] / plain['first_s']:.2f}× plain's, "
                f"peak {r['peak_gib'] / max(plain['peak_gib'], 1e-9):.2f}× plain's"
            )
        cells.append(text)
    return "\n  ".join(cells)


def summarize(row: str, samples: dict[str, list[dict[str, Any]]]) -> str:
    """Medians over repeated processes: a step ratio's spread between identical programs
    reaches a few percent in one process, so a target needs several."""

    def spread(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"

    plain_first = [r["first_s"] for r in samples.get("plain", ()) if "first_s" in r]
    cells = [f"{row}, median (min–max) of {max(len(v) for v in samples.values())} processes:"]
    for variant, rs in samples.items():
        ok = [r for r in rs if "error" not in r]
        ratios = [r["plain_step_ms"] / r["step_ms"] for r in ok if "plain_step_ms" in r]
        again = [r["plain_step_ms"] / r["plain_again_ms"] for r in ok if "plain_again_ms" in r]
        firsts = [r["first_s"] for r in ok]
        text = f"{variant}: {len(ok)} of {len(rs)} finished, first {spread(firsts, '.1f')} s"
        if ratios:
            text += f", {spread(ratios, '.3f')}× plain's step, plain again {spread(again, '.3f')}×"
        if variant != "plain" and plain_first and firsts:
            text += (
                f", first {statistics.median(firsts) / statistics.median(plain_first):.2f}× plain's"
            )
        cells.append(text)
    return "\n  ".join(cells)


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    smoke = ", ".join((*SMOKE_BLOCKS, *SMOKE_LONG, *SMOKE_MOE, *SMOKE_HEADS))
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"comma-separated of {ROWS}; tiny ones for any device: {smoke}",
    )
    parser.add_argument("--variants", default="plain,kt,kt_cold", help=f"of {VARIANTS}")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per process")
    parser.add_argument(
        "--repeat", type=int, default=1, help="processes per (row, variant), then medians"
    )
    parser.add_argument("--json", help="write every result here")
    parser.add_argument("--child", nargs=2, metavar=("ROW", "VARIANT"), help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.child:
        print(json.dumps(child(*a.child)), flush=True)
        return {}
    rows, variants = a.rows.split(","), a.variants.split(",")
    every_row = (*ROWS, *SMOKE_BLOCKS, *SMOKE_LONG, *SMOKE_MOE, *SMOKE_HEADS)
    for name, allowed in ((rows, every_row), (variants, VARIANTS)):
        unknown = sorted(set(name) - set(allowed))
        if unknown:
            parser.error(f"unknown {unknown}; allowed: {', '.join(allowed)}")
    if a.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {a.repeat}")
    # This process never touches the device: each child needs all of its memory.
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        samples: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for _ in range(a.repeat):  # repeats interleaved, so drift hits every variant
            one: dict[str, dict[str, dict[str, Any]]] = {row: {}}
            for variant in variants:
                one[row][variant] = run_one(row, variant, a.timeout)
                samples[variant].append(one[row][variant])
            first = next(iter(one[row].values()))
            if "device" in first:
                print(f"({first['device']}, jax {first['jax']})", flush=True)
            print(describe(one, row), flush=True)
        # The first process's figures, and every process's under "samples".
        results[row] = {
            v: {**rs[0], "samples": rs} if a.repeat > 1 else rs[0] for v, rs in samples.items()
        }
        if a.repeat > 1:
            print(summarize(row, samples), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
