"""kerneltune's ops and two transformer blocks against what a JAX user already has.

    python -m benchmarks.model_gpu [--json OUT.json] [--ops attention,gpt,...]
    python -m benchmarks.model_gpu --smoke      # tiny shapes, any device, wall clock

Run from the repository root; one run prints one table (µs per call unless marked).
Per op (the family benchmarks `attention_gpu`, `rowwise_gpu`, `matmul_gpu`, which also
run alone) at the shapes of the kernels' `shapes.py`: plain XLA/`jnp`, cuDNN (attention), tokamax (when it
imports), kerneltune with its heuristic config and autotuned from an empty cache, the
backend the tuned configs name, best other ÷ tuned time (> 1: tuned is faster), and
for norms and softmax kerneltune's % of a copy's bandwidth measured in the run. Then a
GPT-style and a Llama-style block's jitted `value_and_grad` training step: plain JAX
(cuDNN attention), kerneltune heuristic and tuned, tokamax; "tune s" is the tuning wall.
Then issue 29's ops, `linear_softmax_cross_entropy` and `gated_linear_unit` (forward,
forward + backward), and its small model's training step (`small_model`), through
`loss_head_gpu` (which runs them alone, with more columns); their notes give each
implementation's peak device memory.
benchmarks/README.md says what each column means and how to bring peers: nothing is
installed here, e.g. `pip install --no-index --no-deps --target /tmp/site .whl/*.whl`,
then `PYTHONPATH=/tmp/site python3 -m benchmarks.model_gpu`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import kerneltune as kt
from benchmarks import attention_gpu, loss_head_gpu, matmul_gpu, op_bench, rowwise_gpu
from benchmarks import harness as h
from benchmarks import model_blocks as mb
from benchmarks.op_bench import Settings, log
from benchmarks.results import Row
from kerneltune.kernels.cross_entropy import shapes as loss_shapes
from kerneltune.kernels.gated_linear_unit import shapes as glu_shapes

GPT = mb.BlockShape(batch=8, seq=2048, dim=2048, heads=16, kv_heads=16, hidden=8192)
LLAMA = mb.BlockShape(batch=8, seq=2048, dim=2048, heads=16, kv_heads=4, hidden=5632)
GPT_SMOKE = mb.BlockShape(1, 64, 64, 2, 2, 128)
LLAMA_SMOKE = mb.BlockShape(1, 64, 64, 4, 2, 96)


def _within(context: Any, timed: Callable[[], float]) -> float:
    """One timing session inside `context` (where the tuned program was traced, so
    the same compiled program runs)."""
    with context:
        return timed()


def block_rows(block: str, s: mb.BlockShape, st: Settings) -> list[Row]:
    """One training step of a block: plain JAX, kerneltune heuristic and tuned,
    tokamax; each implementation's first-call wall in `first_call_s`."""
    args = mb.block_inputs(block, s)
    row = Row(block, "train", str(s))
    variants = {
        "plain": mb.plain_ops(),
        "kt_heuristic": mb.kerneltune_ops(op_bench.heuristic_executor()),
    }
    if st.tokamax is not None:
        variants["tokamax"] = mb.tokamax_ops(st.tokamax)
    sessions, steps = {}, {}
    for name, ops in variants.items():
        try:
            steps[name] = step = mb.train_step(block, ops, s)
            row.first_call_s[name] = h.timed_first_call(step, args)
            sessions[name] = h.session(step, [args])
        except Exception as e:
            row.errors[name] = h.error_text(e)
        log(row, name)
    if st.tune:
        tuning = op_bench.tuning_executor(st.tune_budget_s, shipped=st.shipped)
        kt.set_default_executor(tuning.executor)  # what `kt.autotune(f)` and the ops use
        log(row, "kt_tuned")  # tuning a block takes a while
        try:
            step = mb.train_step(block, mb.kerneltune_ops(), s)
            context, row.tune_s, row.note = op_bench.tune_function(step, args)
            with context:
                # The tuned configs are compiled into the program here, once.
                tuned = h.session(step, [args])
                others = {k: f for k, f in steps.items() if k in sessions}
                row.same_program = h.same_program_as({**others, "kt_tuned": step}, "kt_tuned", args)
            sessions["kt_tuned"] = functools.partial(_within, context, tuned)
            row.backend = op_bench.backend_of(tuning.chosen)
        except Exception as e:
            row.errors["kt_tuned"] = h.error_text(e)
        finally:
            kt.set_default_executor(None)
    row.times.update(h.interleaved_times(sessions))
    for name in sessions:
        log(row, name)
    return [row]


def _block(block: str) -> Callable[[mb.BlockShape, Settings], list[Row]]:
    return functools.partial(block_rows, block)


def as_row(r: loss_head_gpu.Result, op: str) -> Row:
    """A `loss_head_gpu` result in this table as `op`'s row: "plain" is the faster of the plain-JAX
    forms timed (float32 or 16-bit logits for the loss head); the note gives each
    implementation's peak device memory; "tune s" is the tuned column's first call,
    tuning included."""
    row = Row(op, r.pass_, r.shape, backend=r.tuned_backend, errors=dict(r.errors))
    row.tune_s = r.first_call_s.get("kt_tuned")
    row.times["plain"] = r.fastest(loss_head_gpu.PLAINS)
    for name in ("tokamax", "kt_heuristic", "kt_tuned"):
        row.times[name] = r.times.get(name)
    row.first_call_s = dict(r.first_call_s)
    row.peak_bytes = {k: v for k, v in r.peak_bytes.items() if v is not None}
    peaks = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in r.peak_bytes.items())
    row.note = f"{r.pass_} peak GiB: {peaks}" if peaks else ""
    return row


def _loss_head_settings(st: Settings) -> loss_head_gpu.Settings:
    lh = loss_head_gpu
    budget = st.tune_budget_s if st.tune_budget_s is not None else lh.TUNE_BUDGET_S
    return lh.Settings(st.tune, budget, lh.ROUNDS, st.tokamax)


def _op_rows(op: str, name: str) -> Callable[[tuple[int, int, int], Settings], list[Row]]:
    def rows(shape: tuple[int, int, int], st: Settings) -> list[Row]:
        results = loss_head_gpu.op_results(op, shape, _loss_head_settings(st))
        return [as_row(r, name) for r in results]

    return rows


def small_model_rows(s: loss_head_gpu.ModelShape, st: Settings) -> list[Row]:
    """Issue 29's small model: embedding, Llama blocks with `gated_linear_unit` and a
    128k-vocabulary `linear_softmax_cross_entropy` head, one training step."""
    return [as_row(loss_head_gpu.model_result(s, _loss_head_settings(st)), "small_model")]


FAMILIES = {
    **attention_gpu.FAMILY,
    **rowwise_gpu.FAMILY,
    **matmul_gpu.FAMILY,
    "gpt": op_bench.Family(_block("gpt"), [GPT], [GPT_SMOKE]),
    "llama": op_bench.Family(_block("llama"), [LLAMA], [LLAMA_SMOKE]),
    # Issue 29's ops and model (also `python -m benchmarks.loss_head_gpu`, which adds
    # plain JAX's 16-bit-logit form as its own column and `--rounds`).
    "linear_softmax_cross_entropy": op_bench.Family(
        _op_rows("loss_head", "linear_softmax_cross_entropy"),
        loss_shapes.BENCH_SHAPES,
        loss_shapes.SMOKE_SHAPES,
    ),
    "gated_linear_unit": op_bench.Family(
        _op_rows("glu", "gated_linear_unit"), glu_shapes.BENCH_SHAPES, glu_shapes.SMOKE_SHAPES
    ),
    "small_model": op_bench.Family(
        small_model_rows, [loss_head_gpu.MODEL], [loss_head_gpu.MODEL_SMOKE]
    ),
}
OPS = tuple(FAMILIES)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Runs the benchmark, prints its table, writes `--json`; returns the rows."""
    return op_bench.run(FAMILIES, argv, "benchmarks.model_gpu", __doc__ or "")


if __name__ == "__main__":
    main()
