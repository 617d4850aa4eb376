"""Config selection: override → overlay → memory → persistent → autotune → heuristics
→ error, with the rules that keep the caches honest.

- An override (`cfg=`) is used as is and written nowhere.
- Heuristic configs are never cached (a later call that may autotune still tunes).
- With `forbid_reautotune`, a key is benchmarked at most once per process; a later
  miss (e.g. after `cache.clear()`) reuses that result.
- Threads that miss the same key at once tune it once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Literal

from kerneltune._src import dispatch, distributed, keys, options, scope, sharding, tracing
from kerneltune._src.cache import CacheKey, ConfigCache
from kerneltune._src.kernel import Invocation, Kernel, key_builder_of
from kerneltune._src.kernel_types import Cfg, Out
from kerneltune._src.tuning.protocol import run_tuner
from kerneltune._src.tuning.report import TuningReport

logger = logging.getLogger("kerneltune")

Fallback = Literal["autotune", "heuristics", "error"]
_FALLBACKS = ("autotune", "heuristics", "error")
Tier = Literal["override", "overlay", "memory", "persistent", "autotune", "reuse", "heuristics"]


class CacheMissError(LookupError):
    """No cached config for a call under `cache_miss_fallback="error"`."""


@dataclasses.dataclass(frozen=True)
class AutotunePolicy:
    """What selection may do on a cache miss.

    Attributes:
      allow_autotune: benchmarking candidates is permitted.
      allow_heuristics: the kernel's heuristic config may be used.
      cache_miss_fallback: on a miss: "autotune" (tune, else heuristics), "heuristics"
        (heuristics, else tune), or "error" (raise `CacheMissError`: production mode,
        never tune at run time).
      validate_backward: time forward + backward when tuning.
    """

    allow_autotune: bool = True
    allow_heuristics: bool = True
    cache_miss_fallback: Fallback = "autotune"
    validate_backward: bool = False

    def __post_init__(self) -> None:
        for name in ("allow_autotune", "allow_heuristics", "validate_backward"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"AutotunePolicy.{name} must be a bool, got {value!r}.")
        if self.cache_miss_fallback not in _FALLBACKS:
            raise ValueError(
                f"AutotunePolicy.cache_miss_fallback must be one of {_FALLBACKS}, got "
                f"{self.cache_miss_fallback!r}."
            )

    @classmethod
    def from_env(cls) -> AutotunePolicy:
        """The policy `KERNELTUNE_AUTOTUNE` asks for (autotune, heuristics or error)."""
        return cls(cache_miss_fallback=options.get("autotune"))


def _normalise_policy_updates(updates: dict[str, Any]) -> dict[str, Any]:
    if "autotune" in updates:
        if "allow_autotune" in updates:
            raise TypeError("pass autotune= or allow_autotune=, not both.")
        updates["allow_autotune"] = updates.pop("autotune")
    fields = {f.name for f in dataclasses.fields(AutotunePolicy)}
    unknown = sorted(set(updates) - fields)
    if unknown:
        raise TypeError(
            f"unknown policy field(s) {unknown}; allowed: {sorted(fields)} (and autotune=)."
        )
    AutotunePolicy(**updates)  # validates the values
    return updates


@dataclasses.dataclass
class Decision:
    """How one config was chosen (what `explain` shows)."""

    tier: Tier
    cfg: Any
    device: str
    op_id_v: str
    call_key: str
    signature: str
    misses: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    report: TuningReport | None = None


class ConfigSelectorChain(Generic[Cfg, Out]):
    """Chooses a config for an invocation by trying each tier in order.

    Args:
      cache: the in-memory cache.
      policy: what to do on a miss (default `AutotunePolicy()`).
      tuner: the benchmarking engine (default `Tuner()`).
      persistent: a `PersistentCache` consulted after memory, or None.
      persist_autotune: write tuned configs to `persistent`.
      on_event: `on_event(event, **data)`, called for "override", "overlay_hit",
        "cache_hit" (level="memory"|"persistent"), "autotune_start",
        "autotune_finish", "heuristics", "error"; `data` has `device`, `op_id`,
        `call_key` and `cfg` where one was chosen. Its exceptions are logged.
      forbid_reautotune: benchmark a key at most once per process.
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
        self.uid = next(self._uids)
        self._listeners: list[Callable[[], None]] = []
        cache.add_invalidation_listener(self._invalidated)
        self._tuned: dict[CacheKey, Any] = {}
        self._reports: dict[CacheKey, TuningReport] = {}
        self._key_locks: dict[CacheKey, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    # -- policy -------------------------------------------------------------------------

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

    # -- choosing -----------------------------------------------------------------------

    def choose(self, inv: Invocation[Cfg, Out], kernel: Kernel[Cfg, Out]) -> Cfg:
        """The config for `inv`; see the class docstring for the order."""
        return self.decide(inv, kernel).cfg

    def decide(self, inv: Invocation[Cfg, Out], kernel: Kernel[Cfg, Out]) -> Decision:
        """Like `choose`, and says which tier supplied the config and why the tiers
        before it missed."""
        inv = _as_keyed_by(inv, kernel)
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
        misses = decision.misses

        def done(tier: Tier, cfg: Any, event: str | None, **extra: Any) -> Decision:
            decision.tier, decision.cfg = tier, cfg
            if event is not None:
                self._emit(event, key, cfg=cfg, **extra)
            return decision

        cfg: Any
        if inv.override_cfg is not None:
            cfg = inv.override_cfg
            check_config_type(kernel, inv, cfg, "cfg")
            return done("override", cfg, "override")
        misses.append(("override", "no cfg= given"))

        cfg = scope.current().overlay_lookup(key)
        if cfg is not None:
            if isinstance(cfg, Mapping):  # e.g. from AutotuningResult.load: plain fields
                cfg_type = config_type_of(kernel, inv)
                if cfg_type is not None and not isinstance(cfg, cfg_type):
                    cfg = keys.config_from_dict(cfg, cfg_type)
            return done("overlay", cfg, "overlay_hit")
        misses.append(("overlay", "no active overlay has this key"))

        cfg = self.cache.get(*key)
        if cfg is not None:
            return done("memory", cfg, "cache_hit", level="memory")
        misses.append(("memory", "not in the memory cache"))

        if self.persistent is not None:
            cfg = self.persistent.get(*key, cfg_type=config_type_of(kernel, inv))
            if cfg is not None:
                self.cache.put(*key, cfg)
                return done("persistent", cfg, "cache_hit", level="persistent")
            misses.append(("persistent", "not in the persistent cache"))
        else:
            misses.append(("persistent", "no persistent cache configured"))

        policy = self.effective_policy()
        if policy.cache_miss_fallback == "error" and policy.allow_heuristics:
            # Production mode forbids tuning, not determinism: when there is nothing to
            # tune, the heuristic is the one config any tuning would have chosen.
            _, untunable = tunable_candidates(kernel, inv)
            heuristic = find_heuristic(kernel, inv) if untunable else None
            if heuristic is not None:
                check_config_type(kernel, inv, heuristic, "heuristic_cfg result")
                misses.append(("autotune", untunable))
                return done("heuristics", heuristic, "heuristics")
        if policy.cache_miss_fallback == "error":
            message = (
                f"no cached config for {inv.op_id_v} with arguments ({inv.signature}) on "
                f"{dev} (call key {inv.call_key}), and the policy forbids tuning at run "
                "time (cache_miss_fallback='error'). Tune offline and ship the cache, or "
                "allow autotuning."
            )
            self._emit("error", key, error=message)
            raise CacheMissError(message)

        order = (
            ["autotune", "heuristics"]
            if policy.cache_miss_fallback == "autotune"
            else ["heuristics", "autotune"]
        )
        for tier in order:
            if tier == "autotune":
                found = self._try_autotune(inv, kernel, key, policy, decision)
                if found is not None:
                    return found
            else:
                heuristic = find_heuristic(kernel, inv) if policy.allow_heuristics else None
                if heuristic is not None:
                    check_config_type(kernel, inv, heuristic, "heuristic_cfg result")
                    scope.chose_provisionally(key)
                    return done("heuristics", heuristic, "heuristics")
                misses.append(
                    (
                        "heuristics",
                        "not allowed by the policy"
                        if not policy.allow_heuristics
                        else "the kernel defines no heuristic_cfg",
                    )
                )

        tried = "; ".join(f"{tier}: {why}" for tier, why in misses)
        message = (
            f"no config for {inv.op_id_v} with arguments ({inv.signature}) on {dev}. "
            f"Tried: {tried}."
        )
        self._emit("error", key, error=message)
        raise RuntimeError(message)

    def _try_autotune(
        self,
        inv: Invocation[Cfg, Out],
        kernel: Kernel[Cfg, Out],
        key: CacheKey,
        policy: AutotunePolicy,
        decision: Decision,
    ) -> Decision | None:
        misses = decision.misses
        candidates, untunable = tunable_candidates(kernel, inv)
        if untunable:
            misses.append(("autotune", untunable))
            return None
        if not policy.allow_autotune:
            misses.append(("autotune", "not allowed by the policy"))
            return None
        with self._lock_for(key):
            # Another thread may have tuned this key while we waited for the lock.
            cfg = self.cache.get(*key)
            if cfg is not None:
                decision.tier, decision.cfg = "memory", cfg
                self._emit("cache_hit", key, cfg=cfg, level="memory")
                return decision
            if self.forbid_reautotune and key in self._tuned:
                cfg = self._tuned[key]
                self.cache.put(*key, cfg)
                decision.tier, decision.cfg, decision.report = "reuse", cfg, self._reports.get(key)
                self._emit("cache_hit", key, cfg=cfg, level="memory", reused=True)
                return decision
            for i, cand in enumerate(candidates):
                check_config_type(kernel, inv, cand, f"candidate #{i}")
            report = self._run_tuner(inv, kernel, key, candidates, policy)
            if report.best is None:
                summary = "; ".join(
                    f"{c.cfg}: {c.status}: {c.error}" for c in report.candidates[:8]
                )
                warnings.warn(
                    f"autotuning {inv.op_id_v} ({inv.signature}) failed for every one of "
                    f"{len(candidates)} candidates; using the heuristic config. Errors: {summary}",
                    RuntimeWarning,
                    stacklevel=4,
                )
                misses.append(("autotune", "every candidate failed"))
                return None
            cfg = report.best
            if self.persistent is not None and self.persist_autotune:
                try:
                    # Create-exclusive: when another process published this key first,
                    # its config is adopted, so that every process uses the same one.
                    stored = self.persistent.put(
                        *key, cfg, report=report, signature=inv.signature, exclusive=True
                    )
                    cfg = cfg if stored is None else stored
                except Exception as e:
                    logger.warning("could not write %s to the persistent cache: %s", key, e)
            self._tuned[key] = cfg
            self._reports[key] = report
            self.cache.put(*key, cfg)
            decision.tier, decision.cfg, decision.report = "autotune", cfg, report
            return decision

    def _run_tuner(
        self,
        inv: Invocation[Cfg, Out],
        kernel: Kernel[Cfg, Out],
        key: CacheKey,
        candidates: list[Any],
        policy: AutotunePolicy,
    ) -> TuningReport:
        heuristic = find_heuristic(kernel, inv)
        if heuristic is not None:
            # Never worse than not tuning: the heuristic is a contender, first in line,
            # so only a config measurably faster replaces it (ties go to the first).
            candidates = [heuristic, *(c for c in candidates if c != heuristic)]
        context = inv.method if inv.method == "shard_map" else None

        def make_fn(cfg: Any) -> Callable[..., Any]:
            return dispatch.kernel_function(kernel, cfg, context)

        backward = policy.validate_backward and not scope.current().forward_only
        self._emit("autotune_start", key, candidates=list(candidates), backward=backward)
        # The call may be inside a jit trace: build inputs and time candidates outside
        # it, or every array made here would be a tracer of the user's program.
        with tracing.outside_traces():
            args, kwargs = concrete_inputs(kernel, inv)
            report: TuningReport = run_tuner(
                self.tuner,
                make_fn,
                args,
                kwargs,
                candidates,
                reference_cfg=heuristic,
                backward=backward,
                name=f"{inv.op_id_v}({inv.signature})",
                reference_fn=dispatch.find_method(kernel, "reference", context),
            )
        # With several processes, every one must end with the same winner (SPMD).
        report = distributed.agree(key, report)
        self._emit(
            "autotune_finish",
            key,
            cfg=report.best,
            report=report,
            timings=[(c.cfg, c.time_s, c.status) for c in report.candidates],
        )
        return report

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


def _as_keyed_by(inv: Invocation[Any, Any], kernel: Kernel[Any, Any]) -> Invocation[Any, Any]:
    """`inv` keyed as the executor keys it: with the kernel's version and key builder
    (an Invocation built by hand may carry neither)."""
    version = str(kernel.version)
    builder = inv.key_builder or key_builder_of(kernel)
    if inv.version == version and inv.key_builder is builder:
        return inv
    return dataclasses.replace(inv, version=version, key_builder=builder)


# -- helpers shared with the executor and explain ------------------------------------


def find_heuristic(kernel: Kernel[Any, Any], inv: Invocation[Any, Any]) -> Any:
    hook = dispatch.find_method(kernel, "heuristic_cfg", _context(inv))
    return None if hook is None else hook(inv)


def tunable_candidates(
    kernel: Kernel[Any, Any], inv: Invocation[Any, Any]
) -> tuple[list[Any], str]:
    """The candidates to tune for this call, and why there is nothing to tune ("" when
    there is): no candidate hook on this platform, an empty list for these arguments,
    or only the heuristic. The kernel's hook is called once."""
    hook = dispatch.find_method(kernel, ("candidate_cfgs", "config_space"))
    if hook is None:
        return [], "the kernel defines no candidate_cfgs/config_space on this platform"
    candidates = list(hook(inv))
    if not candidates:
        return [], f"{type(kernel).__name__}.{hook.__name__} returned no candidates for this call"
    if all(c == candidates[0] for c in candidates) and candidates[0] == find_heuristic(kernel, inv):
        return candidates, "the only candidate is the heuristic config"
    return candidates, ""


def config_type_of(kernel: Kernel[Any, Any], inv: Invocation[Any, Any]) -> type | None:
    """The kernel's config type: `config_type`, else the type `heuristic_cfg` returns."""
    declared = type(kernel).config_type
    if declared is not None:
        return declared
    heuristic = find_heuristic(kernel, inv)
    return None if heuristic is None else type(heuristic)


def check_config_type(
    kernel: Kernel[Any, Any], inv: Invocation[Any, Any], cfg: Any, what: str
) -> None:
    expected = config_type_of(kernel, inv)
    if expected is not None and not isinstance(cfg, expected):
        raise TypeError(
            f"{what} for {kernel.op_id_v} must be a {expected.__qualname__}, got "
            f"{type(cfg).__qualname__} ({cfg!r})."
        )


def concrete_inputs(
    kernel: Kernel[Any, Any], inv: Invocation[Any, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs to benchmark with: the call's own arrays when they are concrete, else
    `kernel.tuning_inputs(inv)` (the call is being traced, or replayed from a record)."""
    import jax

    leaves = jax.tree_util.tree_leaves((inv.args, dict(inv.kwargs)))
    if any(isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct)) for x in leaves):
        hook = dispatch.find_method(kernel, "tuning_inputs", _context(inv))
        made = hook(inv) if hook is not None else kernel.tuning_inputs(inv)
        return tuple(made[0]), dict(made[1])
    return tuple(inv.args), dict(inv.kwargs)


def _context(inv: Invocation[Any, Any]) -> str | None:
    return inv.method if inv.method == "shard_map" else None


# -- scoped policy changes ---------------------------------------------------------------


@contextlib.contextmanager
def policy_override(
    selector: ConfigSelectorChain[Any, Any] | None = None, **updates: Any
) -> Iterator[None]:
    """Changes the policy inside the block; context-local (other threads and tasks do
    not see it) and part of JAX's trace cache key.

    With a `selector`, only that selector is affected; without one, every selector
    (the default executor's included). `autotune=` is shorthand for `allow_autotune=`.

    Example:
      >>> import kerneltune
      >>> sel = kerneltune.ConfigSelectorChain(kerneltune.ConfigCache())
      >>> with kerneltune.policy_override(sel, autotune=False):
      ...     sel.effective_policy().allow_autotune
      False
      >>> sel.effective_policy().allow_autotune
      True
    """
    if selector is not None and not isinstance(selector, ConfigSelectorChain):
        chooser = getattr(selector, "chooser", None)
        if isinstance(chooser, ConfigSelectorChain):
            selector = chooser  # an Executor was passed
        else:
            raise TypeError(
                f"policy_override's selector must be a ConfigSelectorChain (or an "
                f"Executor using one), got {type(selector).__qualname__}."
            )
    updates = _normalise_policy_updates(dict(updates))
    with scope.with_policy_updates(None if selector is None else selector.uid, updates):
        yield


@contextlib.contextmanager
def forward_autotune_only() -> Iterator[None]:
    """Inside the block, autotuning times the forward pass only, even when the policy
    has `validate_backward=True`."""
    with scope.with_forward_only():
        yield


def forward_only_active() -> bool:
    return scope.current().forward_only
