"""The tiers of config selection, one object each: `lookup(inv, kernel, key)` returns
a `Hit` (the config, and the event that announces it) or a `Miss` (why not).

`ConfigSelectorChain` asks its tiers in order and keeps every miss, so `explain`
reports exactly what the chain saw. The tiers that read a cache are here; tuning, which
needs the chain's state (locks, what it tuned before), is `autotune_tier.Autotune`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from kerneltune._src.caching import tuned_neighbours
from kerneltune._src.caching.cache import CacheKey, ConfigCache
from kerneltune._src.core import keys, scope
from kerneltune._src.kernel import hooks
from kerneltune._src.kernel.base import Invocation, Kernel
from kerneltune._src.tuning.report import TuningReport

TierName = Literal[
    "override",
    "overlay",
    "memory",
    "persistent",
    "shipped",
    "autotune",
    "reuse",
    "predicted",
    "heuristics",
]

#: What `explain` says of a config tuned under a first-call budget.
BUDGETED = (
    "tuned under the first-call budget (only the candidates predicted fastest were "
    "timed); a full tuning (kt.autotune, autotune_lowered, kerneltune tune) completes it"
)
#: Why a cache's budgeted config does not answer a full search.
COMPLETING = "tuned under a first-call budget: a full search completes it"


@dataclasses.dataclass(frozen=True)
class Miss:
    """A tier had no config: `reason` says why (shown by `explain` and in errors)."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Hit:
    """A tier's config. `tier` names where it came from (tuning can end in a hit of the
    memory cache, when another thread tuned the key first); `event` and `data` are the
    `on_event` call that announces it; `misses` are noted before it (e.g. why a
    production-mode heuristic stood in for tuning); `budget` says how a first-call
    budget shaped the config (None when it did not)."""

    cfg: Any
    tier: TierName
    event: str | None
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    report: TuningReport | None = None
    misses: tuple[tuple[str, str], ...] = ()
    budget: str | None = None


Found = Hit | Miss


class Tier(Protocol):
    @property
    def name(self) -> TierName: ...

    def lookup(self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey) -> Found:
        """The config for `inv`, or why this tier has none."""
        ...


class Override:
    """`cfg=` given by the caller: used as is, written nowhere."""

    name: TierName = "override"

    def lookup(self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey) -> Found:
        if inv.override_cfg is None:
            return Miss("no cfg= given")
        hooks.check_config_type(kernel, inv, inv.override_cfg, "cfg")
        reason = hooks.unusable_reason(kernel, inv, inv.override_cfg)
        if reason is not None:
            raise ValueError(
                f"cfg={inv.override_cfg!r} cannot run {kernel.op_id_v} here: {reason}."
            )
        return Hit(inv.override_cfg, "override", "override")


class Overlay:
    """The innermost active `overlay_cache` that has the key."""

    name: TierName = "overlay"

    def lookup(self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey) -> Found:
        cfg = scope.current().overlay_lookup(key)
        if cfg is None:
            return Miss("no active overlay has this key")
        if isinstance(cfg, Mapping):  # e.g. from AutotuningResult.load: plain fields
            cfg_type = hooks.config_type_of(kernel, inv)
            if cfg_type is not None and not isinstance(cfg, cfg_type):
                cfg = keys.config_from_dict(cfg, cfg_type)
        # The user's own mapping, as an override is: a config of another type is their
        # error, not a crash inside the kernel's trace.
        hooks.check_config_type(kernel, inv, cfg, "overlay config")
        reason = hooks.unusable_reason(kernel, inv, cfg)
        if reason is not None:
            return Miss(f"the overlay's config {cfg!r} cannot run here: {reason}")
        return Hit(cfg, "overlay", "overlay_hit")


@dataclasses.dataclass(frozen=True)
class Memory:
    """The chain's in-memory cache. With `complete_budgeted` (the policy searches in
    full), a config tuned under a first-call budget is a miss."""

    cache: ConfigCache[Any]
    complete_budgeted: bool = False
    name: TierName = "memory"

    def lookup(self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey) -> Found:
        cfg = self.cache.get(*key)
        if cfg is None:
            return Miss("not in the memory cache")
        if not self.cache.is_budgeted(*key):
            return Hit(cfg, "memory", "cache_hit", {"level": "memory"})
        if self.complete_budgeted:
            return Miss(COMPLETING)
        return Hit(
            cfg, "memory", "cache_hit", {"level": "memory", "budgeted": True}, budget=BUDGETED
        )


@dataclasses.dataclass(frozen=True)
class Stored:
    """A read-only lookup behind the memory cache (the persistent cache, the shipped
    tables); a hit is copied into memory so the next call stops there."""

    name: TierName
    source: Any  # .get(dev, op_id_v, call_key, cfg_type) -> cfg | None; None: not configured
    cache: ConfigCache[Any]
    missing: str  # why a configured source has nothing
    absent: str = "not configured"  # why there is no source
    # Stored configs that failed to trace, by key (shared with the chain, whose next
    # store for the key replaces them): each is warned about once.
    rejected: dict[CacheKey, Any] = dataclasses.field(default_factory=dict)
    # The policy searches in full: a config tuned under a first-call budget is a miss.
    complete_budgeted: bool = False

    def lookup(self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey) -> Found:
        if self.source is None:
            return Miss(self.absent)
        cfg = self.source.get(*key, cfg_type=hooks.config_type_of(kernel, inv))
        if cfg is None:
            return Miss(self.missing)
        # Tuned where something is installed that is not here (a shared cache): tune
        # again rather than fail.
        reason = hooks.unusable_reason(kernel, inv, cfg)
        if reason is not None:
            return Miss(f"its config {cfg!r} cannot run here: {reason}")
        # A config of the right type that the kernel cannot trace (a block of -1, a
        # kernel changed without a version bump) is a miss, not a crash on every call.
        failure = hooks.trace_failure(kernel, inv, cfg)
        if failure is not None:
            if self.rejected.get(key) != cfg:
                self.rejected[key] = cfg
                warnings.warn(
                    f"kerneltune: the {self.name} config {cfg!r} of {inv.op_id_v} "
                    f"({inv.signature}) fails to trace ({failure}); choosing again.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return Miss(f"its config {cfg!r} fails to trace: {failure}")
        if not self._budgeted(key):
            self.cache.put(*key, cfg)
            return Hit(cfg, self.name, "cache_hit", {"level": self.name})
        if self.complete_budgeted:
            return Miss(COMPLETING)
        self.cache.put(*key, cfg, budgeted=True)
        data = {"level": self.name, "budgeted": True}
        return Hit(cfg, self.name, "cache_hit", data, budget=BUDGETED)

    def _budgeted(self, key: CacheKey) -> bool:
        """Whether the source's entry for `key` was tuned under a first-call budget."""
        get_entry = getattr(self.source, "get_entry", None)
        if get_entry is None:
            return False
        try:
            entry = get_entry(*key)
        except Exception:  # the config was read: its provenance is a detail.
            return False
        return getattr(entry, "budgeted", False) is True


@dataclasses.dataclass(frozen=True)
class NearShipped:
    """A key the shipped tables lack, answered from its nearest shipped neighbour when
    that neighbour shows tuning to be pointless: every candidate but the heuristic is of
    a backend at least `tuned_neighbours.FAR_BEHIND` times slower there (a Pallas norm's
    training step 3.8x behind XLA's on an H100, 4.7x on an H200, cost each new size
    1.7-1.9 s of tuning). Only the package's tables decide, so every process of a
    cluster answers alike; a hit is kept in the memory cache, a miss in `missed` (a
    key's candidates and the tables do not change within a process)."""

    shipped: Any  # ShippedTables
    cache: ConfigCache[Any]
    missed: dict[CacheKey, Miss]  # shared with the chain
    name: TierName = "shipped"

    def lookup(self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey) -> Found:
        miss = self.missed.get(key)
        if miss is None:
            found = self._decide(inv, kernel, key)
            if isinstance(found, Hit):
                return found
            miss = self.missed.setdefault(key, found)
        return miss

    def _decide(self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey) -> Found:
        ratios = tuned_neighbours.nearest_ratios(inv.shape, self.shipped.entries_of(*key[:2]))
        heuristic = hooks.find_heuristic(kernel, inv) if ratios else None
        ours = ratios.get(tuned_neighbours.backend_of(heuristic))
        if heuristic is None or ours is None or ours >= tuned_neighbours.FAR_BEHIND:
            return Miss("no shipped neighbour where the heuristic's backend wins")
        candidates, untunable = hooks.tunable_candidates(kernel, inv)
        if untunable:
            return Miss(untunable)
        others = {tuned_neighbours.backend_of(c) for c in candidates if c != heuristic}
        behind = {b: ratios.get(b) for b in others}
        if any(r is None or r < tuned_neighbours.FAR_BEHIND for r in behind.values()):
            return Miss("at the nearest shipped shape another backend is a contender")
        self.cache.put(*key, heuristic)
        far = ", ".join(f"{b} {r:.1f}x" for b, r in sorted(behind.items(), key=str))
        return Hit(heuristic, self.name, "cache_hit", {"level": self.name, "far_behind": far})


@dataclasses.dataclass(frozen=True)
class Heuristic:
    """The kernel's `heuristic_cfg`. Never cached: a later call that may tune still
    tunes. With `only_if_untunable` (production mode) it stands in for tuning only
    where there is nothing to tune, the one config any tuning would have chosen."""

    allowed: bool
    only_if_untunable: bool = False
    name: TierName = "heuristics"

    def lookup(self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any], key: CacheKey) -> Found:
        if not self.allowed:
            return Miss("not allowed by the policy")
        misses: tuple[tuple[str, str], ...] = ()
        if self.only_if_untunable:
            _, untunable = hooks.tunable_candidates(kernel, inv)
            if not untunable:
                return Miss("tuning is forbidden (cache_miss_fallback='error')")
            misses = (("autotune", untunable),)
        cfg = hooks.find_heuristic(kernel, inv)
        if cfg is None:
            return Miss(hooks.no_heuristic_reason(kernel, inv))
        hooks.check_config_type(kernel, inv, cfg, "heuristic_cfg result")
        if not self.only_if_untunable:
            scope.chose_provisionally(key)
        return Hit(cfg, "heuristics", "heuristics", misses=misses)
