"""Config selection: override → overlay → memory → persistent → autotune → heuristics
→ error, with the rules that keep the caches honest. The chain orders the tiers
(`tiers.py`, `autotune_tier.py`), asks them in turn, and writes what tuning found.

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

import dataclasses
import itertools
import logging
from collections.abc import Callable
from typing import Any, Generic

from kerneltune._src.caching import tuned_neighbours
from kerneltune._src.caching.cache import CacheKey, ConfigCache
from kerneltune._src.core import scope
from kerneltune._src.core.call_shapes import CallShape
from kerneltune._src.core.kernel_types import Cfg, Out
from kerneltune._src.kernel import hooks, sharding
from kerneltune._src.kernel.base import Invocation, Kernel
from kerneltune._src.selection import autotune_tier, tiers
from kerneltune._src.selection.decision import Decision, no_config_error
from kerneltune._src.selection.policy import AutotunePolicy as AutotunePolicy
from kerneltune._src.selection.policy import CacheMissError as CacheMissError
from kerneltune._src.selection.policy import FirstCallBudget as FirstCallBudget
from kerneltune._src.selection.policy import completes_budgeted
from kerneltune._src.selection.policy import forward_autotune_only as forward_autotune_only
from kerneltune._src.selection.policy import forward_only_active as forward_only_active
from kerneltune._src.selection.policy import policy_override as policy_override
from kerneltune._src.tuning import lowering_worker
from kerneltune._src.tuning.report import TuningReport
from kerneltune._src.tuning.tuner import Tuner

logger = logging.getLogger("kerneltune")


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
        if autotune is not None and not isinstance(autotune, bool):
            raise TypeError(f"autotune must be a bool or None, got {autotune!r}.")
        if autotune is not None:
            policy = dataclasses.replace(policy, allow_autotune=autotune)
        _check_parts(tuner, persistent, on_event, persist_autotune, forbid_reautotune)
        if tuner is None:
            tuner = Tuner()
        self.cache = cache
        self._policy = policy
        self.tuner = tuner
        self.persistent = persistent
        self.persist_autotune = persist_autotune
        self.on_event = on_event
        self.forbid_reautotune = forbid_reautotune
        self.shipped = shipped
        self._tuned = autotune_tier.TunedKeys()
        self.uid = next(self._uids)
        self._listeners: list[Callable[[], None]] = []
        cache.add_invalidation_listener(self._invalidated)
        # Stored configs that failed to trace, by key (see `tiers.Stored`).
        self._rejected: dict[CacheKey, Any] = {}
        # Keys the shipped tables' nearest neighbours leave to tuning (NearShipped).
        self._near_misses: dict[CacheKey, tiers.Miss] = {}

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
        return self._tuned.reports.get((dev, op_id_v, call_key))

    def choose(self, inv: Invocation[Cfg, Out], kernel: Kernel[Cfg, Out]) -> Cfg:
        """The config for `inv`; see the class docstring for the order."""
        return self.decide(inv, kernel).cfg

    def decide(self, inv: Invocation[Cfg, Out], kernel: Kernel[Cfg, Out]) -> Decision:
        """Like `choose`, and says which tier supplied the config and why the tiers
        before it missed."""
        if lowering_worker.in_worker():  # a flag: every traced call passes here
            lowering_worker.refuse_selection(repr(kernel.op_id))
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
        error = no_config_error(inv, key, policy, decision.misses)
        self._emit("error", key, error=str(error))
        raise error

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
        autotune = autotune_tier.Autotune(
            policy,
            cache,
            self.tuner,
            self.persistent,
            self.shipped,
            self._tuned,
            store=self.store,
            emit=self._emit,
            forbid_reautotune=self.forbid_reautotune,
        )
        heuristic = tiers.Heuristic(policy.allow_heuristics)
        if policy.cache_miss_fallback == "autotune":
            return [*found, autotune, heuristic]
        return [*found, heuristic, autotune]

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
        self._tuned.predicted.pop(key, None)
        timings = [] if report is None else [(c.cfg, c.time_s) for c in report.candidates]
        outcomes = [] if report is None else _outcomes(report)
        self._tuned.neighbours.add(
            key[0], key[1], shape, tuned_neighbours.ranked(timings, cfg), tuple(outcomes)
        )
        return cfg

    def _emit(self, event: str, key: CacheKey, **data: Any) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(event, device=key[0], op_id=key[1], call_key=key[2], **data)
        except Exception:
            logger.exception("kerneltune on_event listener raised for event %r", event)


def _check_parts(
    tuner: Any, persistent: Any, on_event: Any, persist_autotune: Any, forbid_reautotune: Any
) -> None:
    """Checks the chain's arguments when it is made, not at the first call that uses
    them (where a path given as `persistent` would fail, and a callback that cannot be
    called would only be logged)."""
    for name, value in (
        ("persist_autotune", persist_autotune),
        ("forbid_reautotune", forbid_reautotune),
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}.")
    if on_event is not None and not callable(on_event):
        raise TypeError(f"on_event must be callable (event, **data) or None, got {on_event!r}.")
    if tuner is not None and not any(
        callable(getattr(tuner, m, None)) for m in ("tune", "autotune")
    ):
        raise TypeError(
            "tuner must be a Tuner or an object with an autotune(make_fn, args, kwargs, "
            f"candidates) method, or None, got {type(tuner).__qualname__}."
        )
    if persistent is not None and not all(
        callable(getattr(persistent, m, None)) for m in ("get", "put")
    ):
        raise TypeError(
            "persistent must be a PersistentCache (or an object with its get and put "
            f"methods) or None, got {type(persistent).__qualname__} ({persistent!r}); for a "
            "directory or URL pass kerneltune.PersistentCache(path)."
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
