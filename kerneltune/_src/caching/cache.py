"""The in-memory config cache and context-local overlays."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Generic

from kerneltune._src.core import scope
from kerneltune._src.core.kernel_types import Cfg

CacheKey = tuple[str, str, str]  # (device fingerprint, "op@vN", call key)


class ConfigCache(Generic[Cfg]):
    """A thread-safe in-memory map `(device, op_id_v, call_key) -> cfg`.

    Example:
      >>> import kerneltune
      >>> cache = kerneltune.ConfigCache()
      >>> cache.put("cpu|cpu", "matmul@v0", "k1", {"block": 64})
      >>> cache.get("cpu|cpu", "matmul@v0", "k1")
      {'block': 64}
      >>> ("cpu|cpu", "matmul@v0", "k1") in cache, len(cache)
      (True, 1)
    """

    def __init__(self) -> None:
        self._data: dict[CacheKey, Cfg] = {}
        # Keys whose config was tuned under a first-call budget (a full search completes
        # them): kept here so that every chain sharing the cache knows.
        self._budgeted: set[CacheKey] = set()
        self._lock = threading.Lock()
        # Told of every change, so holders of derived state (the executor's eager
        # dispatch table) know when to drop it.
        self._listeners: list[Any] = []

    def add_invalidation_listener(self, listener: Any) -> None:
        """`listener()` is called after every put and clear."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def get(self, dev: str, op_id: str, call_key: str) -> Cfg | None:
        return self._data.get((dev, op_id, call_key))

    def put(self, dev: str, op_id: str, call_key: str, cfg: Cfg, *, budgeted: bool = False) -> None:
        """Caches `cfg` for the key; `budgeted`: it was tuned under a first-call budget
        (`FirstCallBudget`), so a full search of the key still has work to do."""
        if cfg is None:
            raise ValueError("ConfigCache.put got cfg=None; a cached config must be a value.")
        key = (dev, op_id, call_key)
        with self._lock:
            self._data[key] = cfg
            if budgeted:
                self._budgeted.add(key)
            else:
                self._budgeted.discard(key)
        scope.settled(key)
        if budgeted:
            # Traces that use it must give way to the full search's config, when it comes.
            scope.chose_provisionally(key)
        self._changed()

    def is_budgeted(self, dev: str, op_id: str, call_key: str) -> bool:
        """Whether the key's cached config was tuned under a first-call budget."""
        return (dev, op_id, call_key) in self._budgeted

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._budgeted.clear()
        self._changed()

    def size(self) -> int:
        return len(self._data)

    def keys(self) -> list[CacheKey]:
        with self._lock:
            return list(self._data)

    def items(self) -> list[tuple[CacheKey, Cfg]]:
        with self._lock:
            return list(self._data.items())

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __repr__(self) -> str:
        return f"ConfigCache({len(self)} entries)"


@contextlib.contextmanager
def overlay_cache(mapping: Mapping[CacheKey, Any] | ConfigCache[Any]) -> Iterator[None]:
    """Uses the configs in `mapping` inside the block, ahead of every cache.

    `mapping` is `{(device_fingerprint, "<op_id>@v<version>", call_key): cfg}` or a
    `ConfigCache` (its entries are snapshotted on entry). Overlays are context-local
    (other threads do not see them) and nest (the innermost wins). A function jitted
    outside the block and called inside it is re-traced with the overlay's configs, and
    gets its old configs back after the block.
    """
    with scope.with_overlay(scope.Overlay(_overlay_entries(mapping))):
        yield


def _overlay_entries(mapping: Any) -> dict[Any, Any]:
    """`overlay_cache`'s configs as a dict; a TypeError that names the argument, shows
    the value and what is allowed where it is neither a mapping nor a ConfigCache
    (`dict()`'s own error, "'int' object is not iterable", said none of these)."""
    if isinstance(mapping, ConfigCache):
        return dict(mapping.items())
    try:
        return dict(mapping)
    except (TypeError, ValueError):
        raise TypeError(
            "overlay_cache(mapping) needs a mapping {(device_fingerprint, op_id_v, "
            f"call_key): cfg}} or a ConfigCache, got {type(mapping).__name__} "
            f"({mapping!r:.80}). An AutotuningResult applies itself: `with result:`, "
            "or pass result.as_overlay()."
        ) from None
