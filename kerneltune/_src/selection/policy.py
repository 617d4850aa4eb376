"""What selection may do on a cache miss (`AutotunePolicy`), and the scoped ways to
change it: `policy_override` and `forward_autotune_only` (context-local, part of JAX's
trace cache key)."""

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
        return cls(cache_miss_fallback=options.AUTOTUNE.value)


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
