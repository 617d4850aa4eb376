"""Config selection: override → overlay → memory → persistent → autotune → heuristics
→ error, with the rules that keep the caches honest.

- An override (`cfg=`) is used as is and written nowhere.
- Heuristic configs are never cached (a later call that may autotune still tunes).
- With `forbid_reautotune`, a key is benchmarked at most once per process (a later
  miss reuses that result); threads that miss the same key at once tune it once.
- Under a policy with a `FirstCallBudget`, a miss times only the configs a prediction
  ranks best (`first_call.py`), or none; the result is cached as *budgeted*, and a
  policy without a budget (a full tuning) treats such a key as a miss and completes
  its search. A predicted config used untimed is never cached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Generic

from kerneltune._src.caching import tuned_neighbours
from kerneltune._src.caching.cache import CacheKey, ConfigCache
from kerneltune._src.core import scope
from kerneltune._src.core.call_shapes import CallShape
from kerneltune._src.core.kernel_types import Cfg, Out
from kerneltune._src.kernel import hooks, sharding
from kerneltune._src.kernel.base import Invocation, Kernel
from kerneltune._src.selection import first_call, key_tuning, tiers
from kerneltune._src.selection.policy import AutotunePolicy as AutotunePolicy
from kerneltune._src.selection.policy import CacheMissError as CacheMissError
from kerneltune._src.selection.policy import FirstCallBudget as FirstCallBudget
from kerneltune._src.selection.policy import forward_autotune_only as forward_autotune_only
from kerneltune._src.selection.policy import forward_only_active as forward_only_active
from kerneltune._src.selection.policy import policy_override as policy_override
from kerneltune._src.tuning import warm_start
from kerneltune._src.tuning.report import TuningReport

logger = logging.getLogger("kerneltune")


@dataclasses.dataclass
class Decision:
    """How one config was chosen (what `explain` shows)."""

    tier: tiers.TierName
    cfg: Any
    device: str
    op_id_v: str
    call_key: str
    signature: str
    misses: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    report: TuningReport | None = None
    #: How a first-call budget shaped the config (None when it did not).
    budget: str | None = None


class ConfigSelectorChain(Generic[Cfg, Out]):
    """Chooses a config for an invocation by trying each tier in order.

    Args:
      cache: the in-memory cache.
      policy: what to do on a miss (default `AutotunePolicy()`).
      tuner: the benchmarking engine (default `Tuner()`).
      persistent: a `PersistentCache` consulted after memory, or None.
      persist_autotune: write tuned configs to `persistent`.
      on_event: `on_event(event, **data)`, called for "override", "overlay_hit",
        "cache_hit" (level="memory"|"persistent"|"shipped"), "autotune_start",
        "autotune_finish", "predicted" (a config predicted from tuned neighbours,
        used untimed under a first-call budget), "heuristics", "error"; `data` has
        `device`, `op_id`, `call_key` and `cfg` where one was chosen. Its exceptions
        are logged.
      forbid_reautotune: benchmark a key at most once per process.
      shipped: read-only tuned tables keyed by device kind (`shipped.ShippedTables`),
        consulted after `persistent`; the default executor passes the package's own.
      autotune: shorthand for `policy=AutotunePolicy(allow_autotune=autotune)`.
    """

    _uids = itertools.count()

    def __init__(
        self,
        cache: ConfigCache[Cfg] | None = None,
        policy: AutotunePolicy | None = None,
        tuner: Any = None,
        persistent: Any = None,
        persist_autotune: bool = True,
        on_event: Callable[..., None] | None = None,
        forbid_reautotune: bool = True,
        *,
        autotune: bool | None = None,
        shipped: Any = None,
    ) -> None:
        if cache is None:
            cache = ConfigCache()
        if not isinstance(cache, ConfigCache):
            raise TypeError(f"cache must be a ConfigCache, got {type(cache).__qualname__}.")
        if policy is not None and not isinstance(policy, AutotunePolicy):
            raise TypeError(f"policy must be an AutotunePolicy, got {policy!r}.")
        if policy is None:
            policy = AutotunePolicy()
        if autotune is not None:
            policy = dataclasses.replace(policy, allow_autotune=bool(autotune))
        if tuner is None:
            from kerneltune._src.tuning.tuner import Tuner

            tuner = Tuner()
        self.cache = cache
        self._policy = policy
        self.tuner = tuner
        self.persistent = persistent
        self.persist_autotune = persist_autotune
        self.on_event = on_event
        self.forbid_reautotune = forbid_reautotune
        self.shipped = shipped
        self._neighbours = tuned_neighbours.LocalIndex()
        self.uid = next(self._uids)
        self._listeners: list[Callable[[], None]] = []
        cache.add_invalidation_listener(self._invalidated)
        self._tuned: dict[CacheKey, Any] = {}
        # Stored configs that failed to trace, by key (see `tiers.Stored`).
        self._rejected: dict[CacheKey, Any] = {}
        # Keys the shipped tables' nearest neighbours leave to tuning (NearShipped).
        self._near_misses: dict[CacheKey, tiers.Miss] = {}
        self._reports: dict[CacheKey, TuningReport] = {}
        # Keys whose predicted config is used untimed (first-call budget), with the hit.
        self._predicted: dict[CacheKey, tiers.Hit] = {}
        self._first_calls = first_call.Ledger()
        self._key_locks: dict[CacheKey, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    @property
    def policy(self) -> AutotunePolicy:
        return self._policy

    @policy.setter
    def policy(self, value: AutotunePolicy) -> None:
        if not isinstance(value, AutotunePolicy):
            raise TypeError(f"policy must be an AutotunePolicy, got {value!r}.")
        self._policy = value
        self._invalidated()

    def add_invalidation_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` is called whenever a config chosen earlier might now be chosen
        differently (a cache changed, the policy was replaced)."""
        self._listeners.append(listener)

    def _invalidated(self) -> None:
        for listener in list(self._listeners):
            listener()

    def effective_policy(self) -> AutotunePolicy:
        """The policy with the context-local `policy_override`s applied."""
        updates = scope.current().policy_updates_for(self.uid)
        return dataclasses.replace(self._policy, **updates) if updates else self._policy

    def report_for(self, dev: str, op_id_v: str, call_key: str) -> TuningReport | None:
        """The tuning report of a key tuned in this process, if any."""
        return self._reports.get((dev, op_id_v, call_key))

    def choose(self, inv: Invocation[Cfg, Out], kernel: Kernel[Cfg, Out]) -> Cfg:
        """The config for `inv`; see the class docstring for the order."""
        return self.decide(inv, kernel).cfg

    def decide(self, inv: Invocation[Cfg, Out], kernel: Kernel[Cfg, Out]) -> Decision:
        """Like `choose`, and says which tier supplied the config and why the tiers
        before it missed."""
        inv = hooks.as_keyed_by(inv, kernel)
        dev = inv.device_fingerprint
        key: CacheKey = (dev, inv.op_id_v, inv.call_key)
        if inv.method == "shard_map":
            # The kernel sees one shard: its hooks and its tuning get per-shard shapes.
            inv = sharding.per_shard_invocation(inv)
        decision = Decision(
            tier="override",
            cfg=None,
            device=dev,
            op_id_v=key[1],
            call_key=key[2],
            signature=inv.signature,
        )
        policy = self.effective_policy()
        for tier in self._tiers(policy):
            found = tier.lookup(inv, kernel, key)
            if isinstance(found, tiers.Miss):
                decision.misses.append((tier.name, found.reason))
                continue
            decision.misses.extend(found.misses)
            decision.tier, decision.cfg, decision.report = found.tier, found.cfg, found.report
            decision.budget = found.budget
            if found.event is not None:
                self._emit(found.event, key, cfg=found.cfg, **found.data)
            return decision
        raise self._no_config(inv, key, policy, decision.misses)

    def _tiers(self, policy: AutotunePolicy) -> list[tiers.Tier]:
        """The tiers in the order the policy asks them."""
        cache = self.cache
        complete = completes_budgeted(policy)
        found: list[tiers.Tier] = [
            tiers.Override(),
            tiers.Overlay(),
            tiers.Memory(cache, complete_budgeted=complete),
            tiers.Stored(
                "persistent",
                self.persistent,
                cache,
                missing="not in the persistent cache",
                absent="no persistent cache configured",
                rejected=self._rejected,
                complete_budgeted=complete,
            ),
        ]
        if self.shipped is not None:
            found.append(
                tiers.Stored(
                    "shipped",
                    self.shipped,
                    cache,
                    missing="not in the tables shipped for this device kind",
                    rejected=self._rejected,
                )
            )
            if hasattr(self.shipped, "entries_of"):  # tables, not a bare `.get` source
                found.append(tiers.NearShipped(self.shipped, cache, self._near_misses))
        if policy.cache_miss_fallback == "error":
            # Production mode forbids tuning, not determinism.
            return [*found, tiers.Heuristic(policy.allow_heuristics, only_if_untunable=True)]
        autotune, heuristic = Autotune(self, policy), tiers.Heuristic(policy.allow_heuristics)
        if policy.cache_miss_fallback == "autotune":
            return [*found, autotune, heuristic]
        return [*found, heuristic, autotune]

    def _no_config(
        self,
        inv: Invocation[Any, Any],
        key: CacheKey,
        policy: AutotunePolicy,
        misses: list[tuple[str, str]],
    ) -> Exception:
        """The error raised when every tier missed (after announcing it)."""
        where = f"{inv.op_id_v} with arguments ({inv.signature}) on {key[0]}"
        error: Exception
        if policy.cache_miss_fallback == "error":
            error = CacheMissError(
                f"no cached config for {where} (call key {inv.call_key}), and the policy "
                "forbids tuning at run time (cache_miss_fallback='error'). Tune offline and "
                "ship the cache, or allow autotuning."
            )
        else:
            tried = "; ".join(f"{tier}: {why}" for tier, why in misses)
            error = RuntimeError(f"no config for {where}. Tried: {tried}.")
        self._emit("error", key, error=str(error))
        return error

    def autotune(
        self,
        inv: Invocation[Cfg, Out],
        kernel: Kernel[Cfg, Out],
        key: CacheKey,
        policy: AutotunePolicy,
    ) -> tiers.Found:
        """The autotune tier's lookup: tunes the key once (threads that miss it together
        wait for one tuning; with `forbid_reautotune`, a later miss reuses the result)."""
        candidates, untunable = hooks.tunable_candidates(kernel, inv)
        if untunable:
            return tiers.Miss(untunable)
        if not policy.allow_autotune:
            return tiers.Miss("not allowed by the policy")
        complete = completes_budgeted(policy)
        with self._lock_for(key):
            # Another thread may have tuned this key while we waited for the lock.
            cfg = self.cache.get(*key)
            budgeted = cfg is not None and self.cache.is_budgeted(*key)
            if cfg is not None and not (budgeted and complete):
                budget = tiers.BUDGETED if budgeted else None
                return tiers.Hit(cfg, "memory", "cache_hit", {"level": "memory"}, budget=budget)
            earlier = self._reports.get(key)
            budgeted = earlier is not None and earlier.budgeted
            if self.forbid_reautotune and key in self._tuned and not (budgeted and complete):
                cfg = self._tuned[key]
                self.cache.put(*key, cfg, budgeted=budgeted)
                data = {"level": "memory", "reused": True}
                budget = tiers.BUDGETED if budgeted else None
                return tiers.Hit(cfg, "reuse", "cache_hit", data, report=earlier, budget=budget)
            for i, cand in enumerate(candidates):
                hooks.check_config_type(kernel, inv, cand, f"candidate #{i}")
            if policy.budget is not None:
                return self._first_call(inv, kernel, key, candidates, policy, policy.budget)
            report = key_tuning.tune_key(
                inv,
                kernel,
                key,
                candidates,
                tuner=self.tuner,
                # A differentiated call's config also picks its backward: time both.
                backward=policy.validate_backward or bool(inv.differentiated),
                hints=self._hints(inv, kernel, key, len(candidates) + 1),
                emit=self._emit,
            )
            if report.best is None:
                summary = "; ".join(
                    f"{c.cfg}: {c.status}: {c.error}" for c in report.candidates[:8]
                )
                warnings.warn(
                    f"autotuning {inv.op_id_v} ({inv.signature}) failed for every one of "
                    f"{len(report.candidates)} candidates; using the heuristic config. Errors: {summary}",
                    RuntimeWarning,
                    stacklevel=5,
                )
                return tiers.Miss("every candidate failed")
            cfg = self._keep_winner(inv, key, report)
            return tiers.Hit(cfg, "autotune", None, report=report)

    def _first_call(
        self,
        inv: Invocation[Cfg, Out],
        kernel: Kernel[Cfg, Out],
        key: CacheKey,
        candidates: list[Any],
        policy: AutotunePolicy,
        budget: FirstCallBudget,
    ) -> tiers.Found:
        """The autotune tier under a first-call budget (the key's lock held): times the
        shortlist the prediction ranks best, or uses the predicted config untimed."""
        known = self._predicted.get(key)
        if known is not None:
            return known
        predicted = first_call.predict_call(
            inv,
            kernel,
            key,
            candidates,
            local=self._neighbours,
            persistent=self.persistent,
            shipped=self.shipped,
        )
        mine = first_call.plan(predicted, candidates, budget, self._first_calls.spent_s)
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
                tuner=first_call.budget_tuner(self.tuner, budget),
                backward=policy.validate_backward or bool(inv.differentiated),
                hints=[],
                emit=self._emit,
                space=len(plan.space),
            )
        finally:
            self._first_calls.add(time.perf_counter() - start)
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
                    stacklevel=6,
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
        note = first_call.tuned_note(plan, budget, late) if report.budgeted else None
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
        self._tuned[key] = cfg
        self._reports[key] = report
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
        self._predicted[key] = hit
        scope.chose_provisionally(key)
        return hit

    def store(
        self,
        key: CacheKey,
        cfg: Any,
        *,
        report: TuningReport | None = None,
        signature: str = "",
        shape: CallShape | None = None,
        exclusive: bool = False,
    ) -> Any:
        """Caches a tuned config in memory and (when this chain persists tuned configs)
        on disk, where a failed write is only a warning; returns the config now cached
        (with `exclusive`, the one another process published first, if any). With the
        call's `shape`, later calls near it start their tuning from this config."""
        if self.persistent is not None and self.persist_autotune:
            try:
                stored = self.persistent.put(
                    *key,
                    cfg,
                    report=report,
                    signature=signature,
                    shape=shape,
                    exclusive=exclusive,
                )
                if stored is not None and self._rejected.get(key) == stored:
                    # The entry there is one that fails to trace: replace it.
                    self.persistent.put(*key, cfg, report=report, signature=signature, shape=shape)
                    stored = None
                cfg = cfg if stored is None else stored
            except Exception as e:  # a cache write must not fail the run.
                logger.warning("could not write %s to the persistent cache: %s", key, e)
        budgeted = report is not None and report.budgeted
        self.cache.put(*key, cfg, budgeted=budgeted)
        self._predicted.pop(key, None)
        timings = [] if report is None else [(c.cfg, c.time_s) for c in report.candidates]
        outcomes = [] if report is None else _outcomes(report)
        self._neighbours.add(
            key[0], key[1], shape, tuned_neighbours.ranked(timings, cfg), tuple(outcomes)
        )
        return cfg

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
            local=self._neighbours,
            persistent=self.persistent,
            shipped=self.shipped,
        )

    @contextlib.contextmanager
    def _lock_for(self, key: CacheKey) -> Iterator[None]:
        with self._locks_guard:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            yield

    def _emit(self, event: str, key: CacheKey, **data: Any) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(event, device=key[0], op_id=key[1], call_key=key[2], **data)
        except Exception:
            logger.exception("kerneltune on_event listener raised for event %r", event)


def completes_budgeted(policy: AutotunePolicy) -> bool:
    """Whether the policy searches in full on a miss, so that a config tuned under a
    first-call budget is a miss to complete (not a hit)."""
    return (
        policy.budget is None and policy.allow_autotune and policy.cache_miss_fallback == "autotune"
    )


def _outcomes(report: TuningReport) -> list[tuple[Any, float | None]]:
    """The report's measured candidates with their times, and the failed ones with None
    (the ones the search skipped left out): what a prediction reads."""
    out: list[tuple[Any, float | None]] = []
    for c in report.candidates:
        if c.ok:
            out.append((c.cfg, c.time_s))
        elif c.status != "pruned":
            out.append((c.cfg, None))
    return out


@dataclasses.dataclass(frozen=True)
class Autotune:
    """The tier that tunes on a miss (`ConfigSelectorChain.autotune`)."""

    chain: ConfigSelectorChain[Any, Any]
    policy: AutotunePolicy
    name: tiers.TierName = "autotune"

    def lookup(
        self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey
    ) -> tiers.Found:
        return self.chain.autotune(inv, kernel, key, self.policy)
