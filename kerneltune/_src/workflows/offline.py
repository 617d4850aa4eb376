"""Offline tuning: tune recorded calls ahead of time and ship the result.

The workflow:
  1. run the model once with recording on (`KERNELTUNE_RECORD=1` or `record_calls()`);
     every executor call leaves an abstract record (`get_invocations`), which can be
     saved to a manifest for another process (`save_manifest`, `kerneltune tune`);
  2. `autotune_recorded()` tunes every record, or `autotune_lowered(selector, lowered)`
     tunes those whose labels appear in a lowered computation (forward and backward
     kernels alike: each call has its own label and its own config);
  3. the winners land in the selector's memory and persistent caches, and come back as
     an `AutotuningResult`: `with result:` applies them, `result.save(path)` ships them.

Tuning goes through the selector's own autotune path, so it takes the same locks, emits
the same events and writes the same cache entries as tuning at run time.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from kerneltune._src.caching.cache import ConfigCache
from kerneltune._src.caching.result import AutotuningResult, Entry
from kerneltune._src.core import devices, labels, scope
from kerneltune._src.core.coordination import current_peers
from kerneltune._src.execution.default import selector_of
from kerneltune._src.kernel import hooks
from kerneltune._src.kernel.recording import Record, get_invocations, iter_records
from kerneltune._src.selection.chain import (
    AutotunePolicy,
    ConfigSelectorChain,
    policy_override,
)
from kerneltune._src.selection.decision import Decision
from kerneltune._src.tuning import distributed, journal, lowering_pool, shared
from kerneltune._src.workflows import outcome_entries as entries
from kerneltune._src.workflows import split

logger = logging.getLogger("kerneltune")

CallStatus = Literal["tuned", "cached", "untuned", "failed"]


@dataclasses.dataclass(frozen=True)
class CallOutcome:
    """What happened to one record.

    Attributes:
      record: the record.
      status: "tuned" (benchmarked now), "cached" (a tuned config was already in the
        caches), "untuned" (no candidates, or every candidate failed: the heuristic
        will be used), or "failed" (the kernel could not be rebuilt, or tuning raised).
      entry: the result entry, for "tuned" and "cached", and for "untuned" where there
        was nothing to tune (its heuristic config, `entry.untuned` true).
      error: why it was not tuned.
      wall_s: how long it took.
    """

    record: Record
    status: CallStatus
    entry: Entry | None = None
    error: str | None = None
    wall_s: float = 0.0


def tune_records(
    records: Sequence[Record],
    selector: Any = None,
    *,
    force: bool = False,
    progress: bool | None = None,
    on_outcome: Callable[[CallOutcome], None] | None = None,
) -> list[CallOutcome]:
    """Tunes each record in turn; a failure is reported in its `CallOutcome`, never raised.

    Args:
      records: what to tune.
      selector: the `ConfigSelectorChain` (or `Executor`) whose tuner, caches and
        events to use; default: the default executor's.
      force: benchmark again even when the caches hold a tuned config.
      progress: show a progress bar (default: only on a terminal).
      on_outcome: called after each record.

    Under an initialised multi-process JAX job, the records are split across the
    processes (`split.py`: the first key of each family of several keys tuned by all of
    them together, each timing a slice of its candidates; every other key by one of
    them) and every process returns every record's outcome, with the same configs.
    """
    lowering_pool.start_early()  # up by the time the first key's search lowers
    chain = selector_of(selector)
    peers = current_peers()
    if peers is None or peers.num_processes < 2:
        return _tune_here(records, chain, force, progress, on_outcome)
    # A multi-process job: the first key of each family of several is tuned by all
    # together, every other key by one process; all end with all.
    plan = split.plan(records, peers)
    with shared.tuning_shared():
        own = _tune_here(plan.seeds, chain, force, progress, on_outcome)
        for record in plan.seeds:  # one found in its caches, or failed, joins its round
            shared.join_cached(*record.key)
    with distributed.tuning_alone():
        own += _tune_here(plan.share, chain, force, progress, on_outcome)
    merged = split.merge_results(peers, result_of(own), split.config_types(records))
    by_key = {o.record.key: o for o in own}
    outcomes = []
    for record in records:
        outcome = by_key.get(record.key)
        entry = merged.get(*record.key)
        if outcome is not None and entry is not None:
            # The merged entry (the same in every process), not this process's copy; a
            # seed another process held cached gives its config to every process.
            if outcome.entry is not None and outcome.entry.cfg != entry.cfg:
                split.adopt(chain, merged.device, entry)
            outcome = dataclasses.replace(outcome, entry=entry)
        elif outcome is None:
            if entry is None:
                why = "the process it was dealt to could not tune it"
                outcome = CallOutcome(record, "untuned", error=why)
            elif entry.untuned:  # listed by its process with nothing to tune
                outcome = CallOutcome(record, "untuned", entry, entry.strategy)
            else:
                split.adopt(chain, merged.device, entry)
                outcome = CallOutcome(record, "tuned", entry)
            if on_outcome is not None:
                on_outcome(outcome)
        outcomes.append(outcome)
    return outcomes


def _tune_here(
    records: Sequence[Record],
    chain: ConfigSelectorChain[Any, Any],
    force: bool,
    progress: bool | None,
    on_outcome: Callable[[CallOutcome], None] | None,
) -> list[CallOutcome]:
    """Tunes each record in this process, in turn. (Not several at once: their
    compiles would share the CPU cores each one's compiles already fill, and calls of one
    family tuned at once would all start cold instead of warm-starting from each other:
    a GPT block's keys took 80 s that way on an H100, against 36 s in turn.)"""
    from kerneltune._src.tuning.progress import Progress

    bar = Progress("kerneltune tune", enabled=progress)
    bar.add_total(len(records))
    outcomes = []
    try:
        for record in records:
            outcome = _tune_one(record, chain, force)
            outcomes.append(outcome)
            bar.advance(1, stage=record.op_id_v)
            if outcome.status == "failed":
                logger.warning(
                    "Could not tune %s (%s): %s", record.op_id_v, record.signature, outcome.error
                )
            if on_outcome is not None:
                on_outcome(outcome)
    finally:
        bar.close()
    return outcomes


def _tune_one(record: Record, chain: ConfigSelectorChain[Any, Any], force: bool) -> CallOutcome:
    start = time.perf_counter()

    def finish(
        status: CallStatus, entry: Entry | None = None, error: str | None = None
    ) -> CallOutcome:
        return CallOutcome(record, status, entry, error, time.perf_counter() - start)

    journal.tuning_key(record.op_id_v, record.call_key)
    try:
        kernel = record.get_kernel()
        inv = record.invocation(kernel)
        tuner_chain = _fresh_chain(chain) if force else chain
        # Active overlays (e.g. an applied AutotuningResult) must not stand in for
        # tuning, and the policy must allow it: a full search, which also completes the
        # keys a first call tuned under a budget.
        no_overlays = scope.entered(dataclasses.replace(scope.current(), overlays=()))
        full = policy_override(
            tuner_chain, allow_autotune=True, cache_miss_fallback="autotune", budget=None
        )
        with no_overlays, full:
            decision = tuner_chain.decide(inv, kernel)
    except Exception as e:  # one bad record must not stop the others.
        return finish("failed", error=f"{type(e).__name__}: {e}")
    if decision.tier in ("autotune", "reuse"):
        if force:
            _store(chain, decision)
        return finish("tuned", entries.from_report(record, decision))
    if decision.tier in ("memory", "persistent", "shipped"):
        return finish("cached", entries.from_caches(record, chain, decision))
    if decision.tier == "heuristics":
        # A call with nothing to tune is still listed (with why), so that a result
        # shows every kernel call of a function: it is the config tuning would choose.
        try:
            _, untunable = hooks.tunable_candidates(kernel, inv)
        except Exception:
            untunable = ""
        if untunable:
            return finish("untuned", entries.untuned(record, decision, untunable), untunable)
    why = "; ".join(f"{tier}: {reason}" for tier, reason in decision.misses if tier == "autotune")
    return finish("untuned", error=why or f"the config came from {decision.tier}")


def _fresh_chain(chain: ConfigSelectorChain[Any, Any]) -> ConfigSelectorChain[Any, Any]:
    """A chain that shares `chain`'s tuner and events but none of its caches, so that
    everything is benchmarked again."""
    return ConfigSelectorChain(
        ConfigCache(),
        policy=AutotunePolicy(),
        tuner=chain.tuner,
        persistent=None,
        on_event=chain.on_event,
        forbid_reautotune=False,
    )


def _store(chain: ConfigSelectorChain[Any, Any], decision: Decision) -> None:
    key = (decision.device, decision.op_id_v, decision.call_key)
    chain.store(key, decision.cfg, report=decision.report, signature=decision.signature)


def result_of(outcomes: Sequence[CallOutcome]) -> AutotuningResult:
    """The `AutotuningResult` of the tuned and cached outcomes, on this device."""
    entries = tuple(o.entry for o in outcomes if o.entry is not None)
    return AutotuningResult(devices.device_fingerprint(), entries)


def autotune_recorded(
    invocations: Any = None,
    *,
    selector: Any = None,
    force: bool = False,
    progress: bool | None = None,
    isolate: bool = False,
    run_timeout_s: float | None = None,
) -> AutotuningResult:
    """Tunes recorded calls and returns their configs.

    Args:
      invocations: `{op_id_v: {call_key: record}}` (as `get_invocations` or
        `load_manifest` return), `{device: {...}}`, or records; default: the calls
        recorded on this device.
      selector: the `ConfigSelectorChain` (or `Executor`) whose tuner and caches to use;
        default: the default executor's. Winners are written to its memory cache and,
        when it has one, its persistent cache.
      force: benchmark again even when a tuned config is already cached.
      progress: show a progress bar (default: only on a terminal).
      isolate: tune in worker processes (as `kerneltune tune --isolate`), so that a
        candidate that crashes the process (a segfault, an illegal memory access) or
        hangs costs only that candidate, dropped with a warning. The workers use the
        default tuner settings and write winners to the selector's persistent cache
        (without one, apply the returned result with `with result:`); the kernels must
        be defined in importable modules.
      run_timeout_s: a candidate's first run may take this long (see `Tuner`); with
        `isolate`, the worker running it is killed then.

    Returns:
      An `AutotuningResult` with one entry per call that has a tuned config (with every
      candidate's timings when it was tuned in this process or stored with them), and
      one per call with nothing to tune (its heuristic config; `Entry.untuned` true,
      its `strategy` saying why). Calls whose tuning failed are left out, with a
      warning.

    Raises:
      ValueError: `isolate=True` and a kernel is defined in `__main__`.

    Example:
      >>> len(autotune_recorded({}))
      0
    """
    records = iter_records(get_invocations() if invocations is None else invocations)
    if isolate:
        from kerneltune._src.workflows.isolation import autotune_isolated

        persistent = selector_of(selector).persistent
        return autotune_isolated(
            records,
            persistent_location=getattr(persistent, "location", None),
            force=force,
            run_timeout_s=run_timeout_s,
        )
    if run_timeout_s is not None:
        raise ValueError(
            "autotune_recorded(run_timeout_s=...) is for isolate=True; in this process, "
            "give the selector a Tuner(run_timeout_s=...)."
        )
    return result_of(tune_records(records, selector, force=force, progress=progress))


def autotune_lowered(
    selector: Any,
    lowered: Any,
    *,
    invocations: Any = None,
    force: bool = False,
    compiled: bool = False,
    progress: bool | None = None,
) -> AutotuningResult:
    """Tunes every kerneltune call found in a lowered computation.

    The calls are found by their labels (forward and backward kernels alike) and
    matched with the recorded calls; record them first by running the model once with
    `KERNELTUNE_RECORD=1` or inside `record_calls()`.

    Args:
      selector: the `ConfigSelectorChain` (or `Executor`) to tune with; None: the
        default executor's.
      lowered: `jax.jit(f).lower(...)`, its `.compile()`, or an HLO/StableHLO text.
      invocations: the records to match against (default: this device's).
      force: benchmark again even when a tuned config is already cached.
      compiled: also look in the compiled HLO (compiles the computation).
      progress: show a progress bar (default: only on a terminal).

    Returns:
      An `AutotuningResult` with one entry per call found: tuned, cached, or listed
      with nothing to tune (`Entry.untuned`).
    """
    matched = lowered_records(lowered, invocations=invocations, compiled=compiled)
    return result_of(tune_records(matched, selector, force=force, progress=progress))


def lowered_records(
    lowered: Any, *, invocations: Any = None, compiled: bool = False
) -> list[Record]:
    """The recorded calls (of `invocations`, default this device's) whose labels a
    lowered computation holds, in its order; a warning names those never recorded."""
    found = labels.kernel_labels_in_lowered(lowered, compiled=compiled)
    records = {
        r.key: r for r in iter_records(get_invocations() if invocations is None else invocations)
    }
    matched = [
        records[(lab.op_id_v, lab.call_key)]
        for lab in found
        if (lab.op_id_v, lab.call_key) in records
    ]
    if not found:
        logger.warning(
            "autotune_lowered found no kerneltune call in the lowered computation (were the "
            "calls stamped? KERNELTUNE_STAMP=none turns labels off)."
        )
    missing = [
        f"{lab.op_id_v}:{lab.call_key}"
        for lab in found
        if (lab.op_id_v, lab.call_key) not in records
    ]
    if missing:
        logger.warning(
            "autotune_lowered: %d kerneltune call(s) in the lowered computation were never "
            "recorded, so they cannot be tuned: %s. Run the model once with "
            "KERNELTUNE_RECORD=1 (or inside kerneltune.record_calls()) first.",
            len(missing),
            ", ".join(missing),
        )
    return matched
