"""Where a warm start comes from: the winners of tuned calls near a new one.

When a key misses every cache, the calls of the same op, dtypes and static values
tuned at other sizes (in this process, in the persistent cache, in the shipped tables)
say where the new call's best config probably is. `hints` returns their winners, the
nearest call's first (`call_shapes.distance`); the tuner starts its search there
(`tuning/warm_start.py`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from kerneltune._src import call_shapes
from kerneltune._src.cache_entry import CacheEntry
from kerneltune._src.call_shapes import CallShape
from kerneltune._src.configs import config_from_dict

logger = logging.getLogger("kerneltune")

#: How many neighbours' winners a warm start gets.
MAX_HINTS = 4


class LocalIndex:
    """The shapes and winners of the calls tuned (or adopted) in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tuned: dict[tuple[str, str], dict[CallShape, Any]] = {}

    def add(self, dev: str, op_id_v: str, shape: CallShape | None, cfg: Any) -> None:
        if shape is None:
            return
        with self._lock:
            self._tuned.setdefault((dev, op_id_v), {})[shape] = cfg

    def of(self, dev: str, op_id_v: str) -> list[tuple[CallShape, Any]]:
        with self._lock:
            return list(self._tuned.get((dev, op_id_v), {}).items())


def hints(
    shape: CallShape | None,
    dev: str,
    op_id_v: str,
    cfg_type: type[Any] | None,
    *,
    local: LocalIndex | None = None,
    persistent: Any = None,
    shipped: Any = None,
    limit: int = MAX_HINTS,
) -> list[Any]:
    """The winners of the `limit` nearest tuned calls in `shape`'s family, nearest
    first, each config once; [] when the call has no shape or no neighbour is known.
    A cache that cannot be read gives no hints (a warm start is an optimisation)."""
    if shape is None or limit <= 0:
        return []
    tuned: list[tuple[CallShape, Any]] = []
    if local is not None:
        tuned += local.of(dev, op_id_v)
    if persistent is not None:
        try:
            stored = persistent.entries(readonly_layers=True, op_id=op_id_v)
            tuned += _pairs(e for e in stored if e.dev == dev)
        except Exception as e:
            logger.warning("kerneltune: no warm start from the persistent cache: %s", e)
    if shipped is not None:
        tuned += _pairs(shipped.entries_of(dev, op_id_v))
    found = []
    for _, cfg in call_shapes.nearest(shape, _typed(tuned, cfg_type), limit):
        found.append(cfg)
    return found


def _pairs(entries: Iterable[CacheEntry]) -> list[tuple[CallShape, Any]]:
    return [(e.shape, e.cfg) for e in entries if e.shape is not None]


def _typed(
    tuned: list[tuple[CallShape, Any]], cfg_type: type[Any] | None
) -> list[tuple[CallShape, Any]]:
    """The pairs whose configs are (or become) instances of `cfg_type`; stored configs
    are field dicts, and one that no longer fits the type is left out."""
    if cfg_type is None:
        return tuned
    out = []
    for shape, cfg in tuned:
        if not isinstance(cfg, cfg_type):
            try:
                cfg = config_from_dict(cfg, cfg_type)
            except Exception:
                continue
        out.append((shape, cfg))
    return out
