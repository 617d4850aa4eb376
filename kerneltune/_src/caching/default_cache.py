"""The default persistent cache: where `KERNELTUNE_CACHE_DIR` and
`KERNELTUNE_CACHE_READONLY` point, one instance per location."""

from __future__ import annotations

import logging
import threading
from typing import Any

from kerneltune._src.caching import storage
from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.core import options

logger = logging.getLogger("kerneltune")

_defaults: dict[tuple[str, tuple[str, ...]], PersistentCache[Any]] = {}
_defaults_lock = threading.Lock()


def default_persistent_cache() -> PersistentCache[Any] | None:
    """The cache at `KERNELTUNE_CACHE_DIR` (default: the user cache directory) with
    the read-only layers of `KERNELTUNE_CACHE_READONLY`; None when the variable is
    "off", or when the location cannot be opened (with a warning). One instance per
    location, so that each problem is reported once per process."""
    configured = options.CACHE_DIR.value
    if configured is None:
        return None
    key = (configured or storage.default_cache_dir(), tuple(options.CACHE_READONLY.value))
    with _defaults_lock:
        cache = _defaults.get(key)
        if cache is None:
            try:
                cache = PersistentCache(key[0], readonly=key[1])
            except ValueError as e:
                logger.warning("The persistent kerneltune cache is disabled: %s", e)
                return None
            _defaults[key] = cache
        return cache
