"""What selection may do on a cache miss (`AutotunePolicy`, with its `FirstCallBudget`),
and the scoped ways to change it: `policy_override` and `forward_autotune_only`
(context-local, part of JAX's trace cache key)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any, Literal

from kerneltune._src.core import options, scope

Fallback = Literal["autotune", "heuristics", "error"]
_FALLBACKS = ("autotune", "heuristics", "error")


class CacheMissError(LookupError):
    """No cached config for a call under `cache_miss_fallback="error"`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FirstCallBudget:
    """How much tuning the first call of a new key may do at run time.

    Instead of searching the whole space, the first call times the kernel's heuristic
    and the `candidates` configs that a prediction from tuned neighbours (the shipped
    tables, the persistent cache, this process) ranks fastest, for at most `key_s`
    seconds; once the process has spent `process_s` seconds that way, new keys take
    their predicted config untimed. A key tuned this way is marked *budgeted* in the
    caches: a full tuning (`kt.autotune`, `autotune_lowered`, `kerneltune tune`)
    completes its search.

    A key whose prediction drew on timings of tuned calls nearby takes the predicted
    config untimed (`trust_prediction`): its first call costs one compile, as a peer's
    does. At held-out shapes on an H200 that config was 0-5% behind a full search
    where the short timing took 14-16 s for a grouped matmul's training call
    (BENCHMARKS.md, 2026-11-28). Only keys with nothing tuned nearby (a family no table
    holds: users' own kernels, new dtypes) time the shortlist.

    Attributes:
      candidates: predicted-fastest configs timed beside the heuristic (0: none, the
        prediction is used untimed).
      trust_prediction: a prediction drawn from timings of tuned calls nearby is used
        untimed; False: the shortlist is timed at every new key.
      key_s: seconds one key's tuning may take: candidates still building then are
        abandoned (the first in line, the prediction's choice, is waited for as long
        again) and timing stops (making the inputs and the reference output come on
        top).
      process_s: seconds of such tuning per process (per selector chain; the default
        executor's is the process's), all keys together: a key started with less than
        `key_s` (and as long again) left gets what is left, and keys tuned at once by
        several threads share it.
    """

    candidates: int = 3
    key_s: float = 5.0
    process_s: float = 20.0
    trust_prediction: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.candidates, bool) or not isinstance(self.candidates, int):
            raise TypeError(f"FirstCallBudget.candidates must be an int, got {self.candidates!r}.")
        if self.candidates < 0:
            raise ValueError(f"FirstCallBudget.candidates must be >= 0, got {self.candidates!r}.")
        if not isinstance(self.trust_prediction, bool):
            raise TypeError(
                f"FirstCallBudget.trust_prediction must be a bool, got {self.trust_prediction!r}."
            )
        for name in ("key_s", "process_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(
                    f"FirstCallBudget.{name} must be a positive number of seconds, got {value!r}."
                )

    @classmethod
    def from_env(cls) -> FirstCallBudget | None:
        """The budget the `KERNELTUNE_FIRST_CALL_*` options ask for; None when
        `KERNELTUNE_FIRST_CALL_CANDIDATES=all` (the full search on the first call)."""
        candidates = options.FIRST_CALL_CANDIDATES.value
        if candidates is None:
            return None
        return cls(
            candidates=candidates,
            key_s=options.FIRST_CALL_KEY_S.value,
            process_s=options.FIRST_CALL_PROCESS_S.value,
            trust_prediction=options.FIRST_CALL_TRUST_PREDICTION.value,
        )


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
      budget: a `FirstCallBudget`: a miss is tuned on the few candidates a prediction
        ranks best, within seconds, and marked budgeted; None (the default): the full
        search, which also completes keys tuned under a budget. The default executor's
        policy (`from_env`) has one unless `KERNELTUNE_FIRST_CALL_CANDIDATES=all`.
    """

    allow_autotune: bool = True
    allow_heuristics: bool = True
    cache_miss_fallback: Fallback = "autotune"
    validate_backward: bool = False
    budget: FirstCallBudget | None = None

    def __post_init__(self) -> None:
        for name in ("allow_autotune", "allow_heuristics", "validate_backward"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"AutotunePolicy.{name} must be a bool, got {value!r}.")
        if self.budget is not None and not isinstance(self.budget, FirstCallBudget):
            raise TypeError(
                f"AutotunePolicy.budget must be a FirstCallBudget or None, got {self.budget!r}."
            )
        if self.cache_miss_fallback not in _FALLBACKS:
            raise ValueError(
                f"AutotunePolicy.cache_miss_fallback must be one of {_FALLBACKS}, got "
                f"{self.cache_miss_fallback!r}."
            )

    @classmethod
    def from_env(cls) -> AutotunePolicy:
        """The policy `KERNELTUNE_AUTOTUNE` asks for (autotune, heuristics or error),
        with the first-call budget of the `KERNELTUNE_FIRST_CALL_*` options."""
        return cls(cache_miss_fallback=options.AUTOTUNE.value, budget=FirstCallBudget.from_env())


def completes_budgeted(policy: AutotunePolicy) -> bool:
    """Whether the policy searches in full on a miss, so that a config tuned under a
    first-call budget is a miss to complete (not a hit)."""
    return (
        policy.budget is None and policy.allow_autotune and policy.cache_miss_fallback == "autotune"
    )


def normalise_policy_updates(updates: dict[str, Any]) -> dict[str, Any]:
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


@contextlib.contextmanager
def policy_override(selector: Any = None, **updates: Any) -> Iterator[None]:
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
    if selector is not None and not _is_selector(selector):
        chooser = getattr(selector, "chooser", None)
        if _is_selector(chooser):
            selector = chooser  # an Executor was passed
        else:
            raise TypeError(
                f"policy_override's selector must be a ConfigSelectorChain (or an "
                f"Executor using one), got {type(selector).__qualname__}."
            )
    updates = normalise_policy_updates(dict(updates))
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


def _is_selector(obj: Any) -> bool:
    """A `ConfigSelectorChain` (checked by what it has: the chain sits above this
    module): its policy can be overridden on its own."""
    return isinstance(getattr(obj, "uid", None), int) and callable(
        getattr(obj, "effective_policy", None)
    )
