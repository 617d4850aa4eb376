"""Tuned configs shipped inside the package, one table per GPU model.

A table is a cache export file (`kerneltune cache export`) written by
`tools/ship_tables.py` on that GPU. It is read-only and keyed by *device kind*
("NVIDIA H100 80GB HBM3"), not by the full fingerprint: a config tuned under one CUDA
version is a good config under another, while the user's own caches, consulted first,
stay exact. Its entries also seed warm starts (`tuned_neighbours.py`) for calls near the
shapes it covers.
"""

from __future__ import annotations

import functools
import logging
import pathlib
import threading
from collections.abc import Sequence
from typing import Any

from kerneltune._src.caching import storage
from kerneltune._src.caching.cache_entry import BadEntry, CacheEntry, entry_from_document
from kerneltune._src.core.configs import config_from_dict

logger = logging.getLogger("kerneltune")

#: Where the package keeps its tables: `kerneltune/kernels/tables/*.json`.
PACKAGE_TABLES = pathlib.Path(__file__).resolve().parents[2] / "kernels" / "tables"


def device_kind_of(fingerprint: str) -> str:
    """The device kind of a fingerprint: `"NVIDIA H100 80GB HBM3|cuda 12080"` →
    `"NVIDIA H100 80GB HBM3"`."""
    return fingerprint.partition("|")[0]


#: GPU models of one architecture, by a word of their device kind. Where a call's own
#: GPU model has no tuned call of its family, a prediction may draw on another model's
#: table of the same architecture (`ShippedTables.sibling_entries_of`): replayed over
#: the tables (BENCHMARKS.md, 2026-11-28), H100 keys predicted from the H200 table alone
#: were 0% behind their best in median for every op and at most 6.2% at worst (75% for
#: attention, as from the H100's own keys), and the first call's shortlist at most
#: 0.4%; H200 keys from the H100 table: 0% in median, at most 39% at worst, 0.4% for
#: the shortlist.
ARCHITECTURES: dict[str, frozenset[str]] = {
    "hopper": frozenset({"H100", "H200", "H800", "H20", "GH200"}),
}


def architecture_of(kind: str) -> str | None:
    """The architecture of a device kind (`ARCHITECTURES`), or None when unknown.

    Example:
      >>> architecture_of("NVIDIA H100 80GB HBM3"), architecture_of("NVIDIA A100-SXM4-40GB")
      ('hopper', None)
    """
    words = set(kind.upper().replace("-", " ").split())
    return next((arch for arch, models in ARCHITECTURES.items() if words & models), None)


class ShippedTables:
    """Read-only tuned configs keyed by device kind, op and call key.

    A file named for a GPU model of a known architecture (`nvidia-h100-80gb-hbm3.json`,
    as `tools/ship_tables.py` names them) holds that architecture's entries and is read
    only for lookups on a device of it: a CPU or another GPU's first call does not read
    the package's Hopper tables. Any other file is read for every lookup.

    Args:
      paths: table files (cache export files). Unreadable ones are skipped with a
        warning; they are read on first use.
    """

    def __init__(self, paths: Sequence[str | pathlib.Path]) -> None:
        self.paths = tuple(str(p) for p in paths)
        #: The architecture each file's name says, or None (read for every lookup).
        self._named_for = tuple(architecture_of(pathlib.Path(p).stem) for p in self.paths)
        self._lock = threading.Lock()
        self._read: dict[str, list[CacheEntry]] = {}
        self._by_paths: dict[tuple[str, ...], dict[tuple[str, str, str], CacheEntry]] = {}

    def __repr__(self) -> str:
        return f"ShippedTables({list(self.paths)!r})"

    def _index(self, kind: str | None = None) -> dict[tuple[str, str, str], CacheEntry]:
        """`(device kind, op, call key) -> entry` of the tables that may hold `kind`'s
        entries and its siblings' (every table when `kind` is None); where tables
        disagree on a key the one listed first wins."""
        arch = None if kind is None else architecture_of(kind)
        paths = tuple(
            p
            for p, named in zip(self.paths, self._named_for, strict=True)
            if kind is None or named in (None, arch)
        )
        with self._lock:
            index = self._by_paths.get(paths)
            if index is None:
                index = {}
                for path in paths:
                    if path not in self._read:
                        self._read[path] = _read_table(path)
                    for entry in self._read[path]:
                        key = (device_kind_of(entry.dev), entry.op_id_v, entry.call_key)
                        index.setdefault(key, entry)
                self._by_paths[paths] = index
            return index

    def get_entry(self, dev: str, op_id_v: str, call_key: str) -> CacheEntry | None:
        """The shipped entry for a key on a device of `dev`'s kind, or None."""
        kind = device_kind_of(dev)
        return self._index(kind).get((kind, op_id_v, call_key))

    def get(self, dev: str, op_id_v: str, call_key: str, cfg_type: type[Any] | None) -> Any:
        """The shipped config for a key (an instance of `cfg_type`, or its fields when
        no type is given), or None: none shipped, or it no longer fits the type."""
        entry = self.get_entry(dev, op_id_v, call_key)
        if entry is None:
            return None
        if cfg_type is None:
            return dict(entry.cfg)
        try:
            return config_from_dict(entry.cfg, cfg_type)
        except Exception as e:  # includes the config's own validation.
            logger.warning(
                "Skipping the shipped config for %s (%s): it no longer fits %s (%s).",
                op_id_v,
                entry.signature,
                cfg_type.__qualname__,
                e,
            )
            return None

    def entries_of(self, dev: str, op_id_v: str) -> list[CacheEntry]:
        """Every shipped entry of an op on a device of `dev`'s kind."""
        kind = device_kind_of(dev)
        return [e for (k, op, _), e in self._index(kind).items() if k == kind and op == op_id_v]

    def sibling_entries_of(self, dev: str, op_id_v: str) -> list[CacheEntry]:
        """Every shipped entry of an op on the other GPU models of `dev`'s architecture
        (none for an architecture `ARCHITECTURES` does not list), ordered by model."""
        kind = device_kind_of(dev)
        arch = architecture_of(kind)
        if arch is None:
            return []
        found = [
            (k, e)
            for (k, op, _), e in self._index(kind).items()
            if op == op_id_v and k != kind and architecture_of(k) == arch
        ]
        return [e for _, e in sorted(found, key=lambda pair: pair[0])]

    def __len__(self) -> int:
        return len(self._index())


def _read_table(path: str) -> list[CacheEntry]:
    try:
        docs = storage.read_export_file(path)
    except (OSError, ValueError) as e:
        logger.warning("Skipping the shipped kerneltune table %s: %s", path, e)
        return []
    entries = []
    for i, doc in enumerate(docs):
        try:
            entries.append(entry_from_document(doc, f"{path}#{i}"))
        except BadEntry as e:
            logger.warning("Skipping entry #%d of the shipped table %s: %s", i, path, e)
    return entries


@functools.cache
def package_tables() -> ShippedTables:
    """The tables that ship with kerneltune (`kerneltune/kernels/tables/*.json`)."""
    return ShippedTables(sorted(PACKAGE_TABLES.glob("*.json")))
