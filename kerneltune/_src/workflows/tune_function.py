"""Tuning a whole function in one call: `kt.autotune(f, *args, **kwargs)`.

`f` is traced and lowered once with every kerneltune call recorded and resolved by the
heuristic (nothing is benchmarked while tracing), then every kerneltune call found in
the lowered program — forward and backward kernels alike — is tuned, and the result is
returned. The tuned configs land in the selector's caches, so `f` (jitted or not,
traced before or not) uses them on its next call.

Each key is tuned alone, but inside `f` XLA fuses a library backend's work with its
neighbours (a norm into the next matmul, a bias into cuBLAS's epilogue), which a
kernel timed alone cannot show. So when tuning changed a config whose tuned or
heuristic backend is not a Pallas kernel of its own, `f` itself is timed with the
tuned configs and with the heuristic ones, side by side; the tuned ones are kept only
when `f` is measurably faster with them (never slower than not tuning). Where every
change is from one Pallas kernel to another (a custom call XLA fuses nothing into:
`hooks.runs_alone`), the kernels' own times already say it, and `f` is not compiled
twice more to say it again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import jax

from kerneltune._src.caching.result import AutotuningResult
from kerneltune._src.core import keys
from kerneltune._src.core.configs import config_from_dict, config_to_dict
from kerneltune._src.execution.default import selector_of
from kerneltune._src.kernel import hooks, recording
from kerneltune._src.selection.chain import ConfigSelectorChain, policy_override
from kerneltune._src.tuning import distributed, lowering_pool
from kerneltune._src.tuning.programs import split_static
from kerneltune._src.tuning.protocol import run_tuner
from kerneltune._src.workflows import offline

logger = logging.getLogger("kerneltune")

#: The two variants of `f` timed side by side; the first wins ties.
HEURISTIC, TUNED = "heuristic configs", "tuned configs"


def autotune_function(
    f: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    selector: Any = None,
    tuner: Any = None,
    force: bool = False,
    progress: bool | None = None,
) -> AutotuningResult:
    """Tunes every kerneltune call `f(*args, **kwargs)` makes.

    Args:
      f: any JAX-traceable function (e.g. a train step or `jax.value_and_grad(loss)`).
      args, kwargs: its arguments: arrays or `jax.ShapeDtypeStruct`s (only shapes and
        dtypes matter: tuning runs on random data); other leaves are static.
      selector: the `ConfigSelectorChain` or `Executor` whose caches receive the
        configs (default: the default executor's).
      tuner: a tuner to benchmark with instead of the selector's own.
      force: benchmark again even when a tuned config is already cached.
      progress: show a progress bar (default: only on a terminal).

    Returns:
      An `AutotuningResult` with one entry per kerneltune call in `f`.
    """
    if not callable(f):
        raise TypeError(f"autotune needs a Kernel or a function, got {type(f).__qualname__}.")
    lowering_pool.start_early()  # up by the time the first key's search lowers
    chain = selector_of(selector)
    if tuner is not None:
        chain = ConfigSelectorChain(
            chain.cache,
            policy=chain.policy,
            tuner=tuner,
            persistent=chain.persistent,
            persist_autotune=chain.persist_autotune,
            on_event=chain.on_event,
        )
    arrays, rebuild = split_static(args, kwargs)

    def call(*leaves: Any) -> Any:
        a, k = rebuild(leaves)
        return f(*a, **k)

    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in arrays]
    # Trace once: record every call, benchmark none of them yet.
    with (
        recording.record_calls(),
        policy_override(None, allow_autotune=False, cache_miss_fallback="heuristics"),
    ):
        lowered = jax.jit(call).lower(*specs)
        records = recording.get_invocations()
    matched = offline.lowered_records(lowered, invocations=records)
    outcomes = offline.tune_records(matched, chain, force=force, progress=progress)
    result = offline.result_of(outcomes)
    if not any(o.status == "tuned" for o in outcomes):
        return result  # every config came from the caches: decided before
    baseline = _heuristic_result(result)
    if baseline is None:
        return result  # tuning changed nothing: nothing to compare
    kernels = {(r.op_id_v, r.call_key): r.kernel for r in matched if r.kernel is not None}
    if only_pallas_changed(result, baseline, kernels):
        return result
    return keep_if_faster(chain, call, specs, result, baseline)


def only_pallas_changed(
    result: AutotuningResult,
    baseline: AutotuningResult,
    kernels: dict[tuple[str, str], Any],
) -> bool:
    """True when every config tuning changed (`result` against its heuristic
    `baseline`) runs, tuned and heuristic alike, as a Pallas kernel on the device
    (`hooks.runs_alone`): timed alone, each is timed as it runs inside the function."""
    for tuned, heuristic in zip(result, baseline, strict=True):
        if config_to_dict(tuned.cfg) == config_to_dict(heuristic.cfg):
            continue
        kernel = kernels.get((tuned.op_id_v, tuned.call_key))
        if kernel is None:
            return False
        if not (hooks.runs_alone(kernel, tuned.cfg) and hooks.runs_alone(kernel, heuristic.cfg)):
            return False
    return True


#: The op id under which processes agree on keeping tuned configs for a whole function.
WHOLE_FUNCTION_OP = "kerneltune.whole_function@v0"


def keep_if_faster(
    chain: ConfigSelectorChain[Any, Any],
    call: Callable[..., Any],
    specs: list[jax.ShapeDtypeStruct],
    result: AutotuningResult,
    baseline: AutotuningResult,
) -> AutotuningResult:
    """`result`, or `baseline` (its heuristic configs, `_heuristic_result`) where
    `call` is not measurably faster with the tuned ones (timed whole, side by side;
    ties keep the heuristic)."""
    variants = {HEURISTIC: baseline, TUNED: result}

    def make_fn(which: str) -> Callable[..., Any]:
        def run(*leaves: Any) -> Any:
            with variants[which]:  # selection happens while this traces
                return call(*leaves)

        return run

    report = run_tuner(
        chain.tuner,
        make_fn,
        specs,
        {},
        [HEURISTIC, TUNED],
        reference_cfg=HEURISTIC,
        backward=False,
        name="the whole function",
    )
    # Every process of a job must keep the same configs (one program): they agree on
    # this choice as on any tuned key (a no-op with one process).
    keys_tuned = sorted((e.op_id_v, e.call_key) for e in result)
    whole = (result.device, WHOLE_FUNCTION_OP, keys.hash_text(keys.stable_json(keys_tuned)))
    report = distributed.agree(whole, report)
    if report.best == TUNED:
        return result
    times = {c.cfg: c.time_s for c in report.candidates}
    logger.info(
        "kerneltune: the function is not faster with the tuned configs (%s) than with the "
        "heuristic ones (%s): keeping the heuristic configs",
        times.get(TUNED),
        times.get(HEURISTIC),
    )
    for entry in baseline:
        key = (result.device, entry.op_id_v, entry.call_key)
        chain.store(key, entry.cfg, signature=entry.signature)
    return baseline


def _heuristic_result(result: AutotuningResult) -> AutotuningResult | None:
    """`result` with every tuned config replaced by its heuristic config (typed as
    the tuned one), or None when no tuned config differs from its heuristic."""
    entries, changed = [], False
    for e in result:
        if e.heuristic_cfg is None or not dataclasses.is_dataclass(e.cfg):
            entries.append(e)
            continue
        heuristic = config_from_dict(e.heuristic_cfg, type(e.cfg))
        changed = changed or config_to_dict(heuristic) != config_to_dict(e.cfg)
        entries.append(dataclasses.replace(e, cfg=heuristic))
    return AutotuningResult(result.device, tuple(entries)) if changed else None
