"""The autotune tier: tuning a key on a miss, in full or under a first-call budget, and
what a selector chain remembers of its tunings between calls (`TunedKeys`).

- Threads that miss the same key at once tune it once (one lock per key); with
  `forbid_reautotune`, a later miss reuses the result. A miss inside a tuning's
  lowering (a kernel called by a candidate's backward) lets go of the lowering lock
  while it tunes or waits (`programs.lowering_released`).
- Under a `FirstCallBudget`, a miss times only the shortlist a prediction ranks best
  (`first_call.py`), or nothing: the predicted config is then used untimed, kept for
  the key in this process and never cached.
- A winner is stored exclusively: another process's earlier config wins, so all use
  the same one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from kerneltune._src.caching import tuned_neighbours
from kerneltune._src.caching.cache import CacheKey, ConfigCache
from kerneltune._src.core import scope
from kerneltune._src.kernel import hooks
from kerneltune._src.kernel.base import Invocation, Kernel
from kerneltune._src.selection import first_call, key_tuning, tiers
from kerneltune._src.selection.policy import AutotunePolicy, FirstCallBudget, completes_budgeted
from kerneltune._src.tuning import programs, warm_start
from kerneltune._src.tuning.report import TuningReport


class TunedKeys:
    """What one selector chain has tuned in this process, by key: the winners (reused
    with `forbid_reautotune`) and their reports (also of the keys whose every candidate
    failed, which `forbid_reautotune` does not tune again), the predicted configs used untimed
    (first-call budget), the seconds first calls have spent, the tuned calls near a new
    one (`neighbours`), and one lock per key."""

    def __init__(self) -> None:
        self.winners: dict[CacheKey, Any] = {}
        self.reports: dict[CacheKey, TuningReport] = {}
        # Keys whose predicted config is used untimed (first-call budget), with the hit.
        self.predicted: dict[CacheKey, tiers.Hit] = {}
        self.first_calls = first_call.Ledger()
        self.neighbours = tuned_neighbours.LocalIndex()
        self._key_locks: dict[CacheKey, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    @contextlib.contextmanager
    def lock_for(self, key: CacheKey) -> Iterator[None]:
        with self._locks_guard:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            yield


@dataclasses.dataclass(frozen=True)
class Autotune:
    """The tier that tunes on a miss, with its chain's parts: `store` is the chain's
    (`ConfigSelectorChain.store`), `emit(event, key, **data)` its `on_event` call, and
    `tuned` its memory of earlier tunings."""

    policy: AutotunePolicy
    cache: ConfigCache[Any]
    tuner: Any
    persistent: Any
    shipped: Any
    tuned: TunedKeys
    store: Callable[..., Any]
    emit: Callable[..., None]
    forbid_reautotune: bool = True
    name: tiers.TierName = "autotune"

    def lookup(
        self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey
    ) -> tiers.Found:
        """Tunes the key once (threads that miss it together wait for one tuning; with
        `forbid_reautotune`, a later miss reuses the result)."""
        candidates, untunable = hooks.tunable_candidates(kernel, inv)
        if untunable:
            return tiers.Miss(untunable)
        policy = self.policy
        if not policy.allow_autotune:
            return tiers.Miss("not allowed by the policy")
        complete = completes_budgeted(policy)
        tuned = self.tuned
        # A miss inside a lowering (a kernel its trace calls) lets other threads lower
        # while this key is tuned, or while another thread's tuning of it ends.
        with programs.lowering_released(), tuned.lock_for(key):
            # Another thread may have tuned this key while we waited for the lock.
            cfg = self.cache.get(*key)
            budgeted = cfg is not None and self.cache.is_budgeted(*key)
            if cfg is not None and not (budgeted and complete):
                budget = tiers.BUDGETED if budgeted else None
                return tiers.Hit(cfg, "memory", "cache_hit", {"level": "memory"}, budget=budget)
            earlier = tuned.reports.get(key)
            budgeted = earlier is not None and earlier.budgeted
            if self.forbid_reautotune and key in tuned.winners and not (budgeted and complete):
                cfg = tuned.winners[key]
                self.cache.put(*key, cfg, budgeted=budgeted)
                data = {"level": "memory", "reused": True}
                budget = tiers.BUDGETED if budgeted else None
                return tiers.Hit(cfg, "reuse", "cache_hit", data, report=earlier, budget=budget)
            if self.forbid_reautotune and earlier is not None and earlier.best is None:
                # Benchmarked once already, and warned about: the heuristic stands in.
                return tiers.Miss("every candidate failed when tuned earlier in this process")
            for i, cand in enumerate(candidates):
                hooks.check_config_type(kernel, inv, cand, f"candidate #{i}")
            if policy.budget is not None:
                return self._first_call(inv, kernel, key, candidates, policy.budget)
            report = key_tuning.tune_key(
                inv,
                kernel,
                key,
                candidates,
                tuner=self.tuner,
                # A differentiated call's config also picks its backward: time both.
                backward=policy.validate_backward or bool(inv.differentiated),
                hints=self._hints(inv, kernel, key, len(candidates) + 1),
                emit=self.emit,
            )
            if report.best is None:
                # The candidates a search passed over did not fail: the warning names
                # the errors of those it tried, and counts the others apart.
                failed = [c for c in report.candidates if c.status != "pruned"]
                summary = "; ".join(f"{c.cfg}: {c.status}: {c.error}" for c in failed[:8])
                untried = len(report.candidates) - len(failed)
                others = f" ({untried} others not tried)" if untried else ""
                warnings.warn(
                    f"autotuning {inv.op_id_v} ({inv.signature}) failed for every one of "
                    f"{len(failed)} candidates tried{others}; using the heuristic config. "
                    f"Errors: {summary}",
                    RuntimeWarning,
                    stacklevel=4,
                )
                tuned.reports[key] = report
                return tiers.Miss("every candidate failed")
            cfg = self._keep_winner(inv, key, report)
            return tiers.Hit(cfg, "autotune", None, report=report)

    def _first_call(
        self,
        inv: Invocation[Any, Any],
        kernel: Kernel[Any, Any],
        key: CacheKey,
        candidates: list[Any],
        budget: FirstCallBudget,
    ) -> tiers.Found:
        """The tier under a first-call budget (the key's lock held): times the shortlist
        the prediction ranks best, or uses the predicted config untimed."""
        tuned = self.tuned
        known = tuned.predicted.get(key)
        if known is not None:
            return known
        predicted = first_call.predict_call(
            inv,
            kernel,
            key,
            candidates,
            local=tuned.neighbours,
            persistent=self.persistent,
            shipped=self.shipped,
        )
        # Granted before the plan: threads missing other keys at once share what is
        # left of the process's seconds, rather than each taking a key's worth.
        grant = tuned.first_calls.grant(budget)
        took = 0.0
        try:
            mine = first_call.plan(predicted, candidates, budget, grant.committed_s)
            plan = first_call.agreed(key, mine, what=f"{inv.op_id_v}({inv.signature})")
            if not plan.shortlist:
                return self._use_prediction(inv, kernel, key, plan)
            start = time.perf_counter()
            try:
                report = key_tuning.tune_key(
                    inv,
                    kernel,
                    key,
                    list(plan.shortlist),
                    tuner=first_call.budget_tuner(self.tuner, grant),
                    backward=self.policy.validate_backward or bool(inv.differentiated),
                    hints=[],
                    emit=self.emit,
                    space=len(plan.space),
                    in_order=True,
                )
            finally:
                took = time.perf_counter() - start
        finally:
            tuned.first_calls.settle(grant, took)
        late = sum(1 for c in report.candidates if c.status == "pruned")
        if report.best is None:
            failed = report.num_failed
            why = (
                f"none of the {len(plan.shortlist)} timed candidates ran within the "
                f"first-call budget ({failed} failed, {late} not run in time)"
            )
            if failed:
                warnings.warn(
                    f"autotuning {inv.op_id_v} ({inv.signature}) under the first-call budget "
                    f"found no config: {report.describe_failures()}; using the predicted one.",
                    RuntimeWarning,
                    stacklevel=5,
                )
            return self._use_prediction(
                inv, kernel, key, dataclasses.replace(plan, why_untimed=why)
            )
        if first_call.first_choice_untimed(plan, report):
            # Only configs that build faster were timed: their times rank nothing
            # against the first choice (a slow-compiling library kernel, say).
            why = (
                f"the first choice {plan.shortlist[0]!r} was not timed within the "
                f"first-call budget ({late} not run in time)"
            )
            return self._use_prediction(
                inv, kernel, key, dataclasses.replace(plan, why_untimed=why)
            )
        cfg = self._keep_winner(inv, key, report)
        note = first_call.tuned_note(plan, grant.limit, late) if report.budgeted else None
        return tiers.Hit(cfg, "autotune", None, report=report, budget=note)

    def _keep_winner(self, inv: Invocation[Any, Any], key: CacheKey, report: Any) -> Any:
        """Stores a tuning's winner and remembers it (and its report) for the key.
        Exclusive: another process's earlier config wins, so all use the same one."""
        cfg = self.store(
            key,
            report.best,
            report=report,
            signature=inv.signature,
            shape=inv.shape,
            exclusive=True,
        )
        self.tuned.winners[key] = cfg
        self.tuned.reports[key] = report
        return cfg

    def _use_prediction(
        self,
        inv: Invocation[Any, Any],
        kernel: Kernel[Any, Any],
        key: CacheKey,
        plan: first_call.Plan,
    ) -> tiers.Hit:
        """The predicted config, untimed: the first of `plan.untimed` that traces (the
        heuristic last). Kept for the key in this process, never cached: a later tuning
        still tunes."""
        heuristic = plan.prediction.heuristic
        cfg = plan.untimed[-1]
        for option in plan.untimed:
            if option == heuristic or hooks.trace_failure(kernel, inv, option) is None:
                cfg = option
                break
        note = first_call.predicted_note(plan)
        hit = tiers.Hit(cfg, "predicted", "predicted", {"budget": note}, budget=note)
        self.tuned.predicted[key] = hit
        scope.chose_provisionally(key)
        return hit

    def _hints(
        self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey, size: int
    ) -> list[Any]:
        """The winners of the tuned calls nearest to `inv` (a warm start); none unless a
        search of `size` candidates would use them (gathering reads the op's entries)."""
        if not warm_start.may_warm_start(getattr(self.tuner, "strategy", None), size):
            return []
        return tuned_neighbours.hints(
            inv.shape,
            key[0],
            key[1],
            hooks.config_type_of(kernel, inv),
            local=self.tuned.neighbours,
            persistent=self.persistent,
            shipped=self.shipped,
        )
