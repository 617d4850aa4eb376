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
benchmarks/README.md says what each column means and how to bring peers: nothing is
installed here, e.g. `pip install --no-index --no-deps --target /tmp/site .whl/*.whl`,
then `PYTHONPATH=/tmp/site python3 -m benchmarks.model_gpu`.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import kerneltune as kt
from benchmarks import attention_gpu, matmul_gpu, op_bench, rowwise_gpu
from benchmarks import harness as h
from benchmarks import model_blocks as mb
from benchmarks.op_bench import Settings, log
from benchmarks.results import Row

GPT = mb.BlockShape(batch=8, seq=2048, dim=2048, heads=16, kv_heads=16, hidden=8192)
LLAMA = mb.BlockShape(batch=8, seq=2048, dim=2048, heads=16, kv_heads=4, hidden=5632)
GPT_SMOKE = mb.BlockShape(1, 64, 64, 2, 2, 128)
LLAMA_SMOKE = mb.BlockShape(1, 64, 64, 4, 2, 96)


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
            context, row.tune_s, row.note = tune_function(step, args)
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


FAMILIES = {
    **attention_gpu.FAMILY,
    **rowwise_gpu.FAMILY,
    **matmul_gpu.FAMILY,
    "gpt": op_bench.Family(_block("gpt"), [GPT], [GPT_SMOKE]),
    "llama": op_bench.Family(_block("llama"), [LLAMA], [LLAMA_SMOKE]),
}
OPS = tuple(FAMILIES)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Runs the benchmark, prints its table, writes `--json`; returns the rows."""
    return op_bench.run(FAMILIES, argv, "benchmarks.model_gpu", __doc__ or "")


if __name__ == "__main__":
    main()
