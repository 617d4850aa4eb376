"""Cleaning a persistent cache, and moving entries between caches (export files).

An export file is one JSON document holding entry documents (see `cache_entry`); it is
what `kerneltune cache export` writes, what `kerneltune tune --out` and
`AutotuningResult.save` write, and what `import`, `merge` and read-only layers read.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from kerneltune._src.caching import storage
from kerneltune._src.caching.cache_entry import (
    BadEntry,
    CacheEntry,
    Provenance,
    check_provenance,
    entry_from_document,
    entry_relpath,
    op_matches,
    runtime_versions,
)
from kerneltune._src.core import files

_TEMP_MAX_AGE_S = 3600.0


class CacheSharing:
    """`PersistentCache`'s cleaning and sharing (a base class: the reading and writing
    of single entries it builds on live in `persistent.py`)."""

    if TYPE_CHECKING:
        _store: storage.Store
        _warn: Callable[[str, str], None]

        def __init__(self, path: Any = None) -> None: ...
        def entries(self, *, readonly_layers: bool = False) -> Iterator[CacheEntry]: ...
        def _walk(self, layers: Iterable[storage.Store]) -> Iterator[tuple[storage.Store, str]]: ...
        def _read(self, layer: storage.Store, rel: str) -> bytes | None: ...
        def _decode(self, layer: storage.Store, rel: str, data: bytes) -> CacheEntry | None: ...
        def _build(self, entry: CacheEntry, cfg_type: type) -> Any: ...
        def _delete(self, rel: str) -> int: ...
        def _write(self, entry: CacheEntry, *, exclusive: bool = False) -> bool: ...
        def _time(self) -> float: ...

    def clear(self, op_id: str | None = None) -> int:
        """Removes every entry of the writable layer, or those of one op ("matmul" or
        "matmul@v1"); returns how many. Read-only layers are never touched."""
        if op_id is None:
            rels = {rel for _, rel in self._walk([self._store])}
            self._store.remove_temporaries(older_than_s=_TEMP_MAX_AGE_S)
        else:
            rels = {entry_relpath(*e.key) for e in self.entries() if op_matches(e.op_id, op_id)}
        return sum(self._delete(rel) for rel in sorted(rels))

    def prune(
        self,
        older_than_days: float | None = None,
        other_versions: bool = False,
        *,
        invalid: bool = False,
        cfg_types: Mapping[str, type] | None = None,
        temp_older_than_s: float = _TEMP_MAX_AGE_S,
    ) -> int:
        """Removes stale entries from the writable layer; returns how many.

        Args:
          older_than_days: remove entries written more than this many days ago (>= 0).
          other_versions: remove entries written by another kerneltune, jax or jaxlib
            version, and entries this version cannot read (other schemas, corrupt).
          invalid: remove entries that cannot be read (corrupt, not a regular file, too
            large), and those whose config does not fit its op's type in `cfg_types`.
          cfg_types: config types by op id ("matmul") or op id with version.
          temp_older_than_s: temporary files left behind by killed writers are removed
            once they are this old (at once when their writer died on this host; they
            are not counted).

        Raises:
          ValueError: `older_than_days` is negative or not a number.
        """
        if older_than_days is not None and not older_than_days >= 0:
            raise ValueError(
                f"older_than_days must be a number of days >= 0, got {older_than_days!r}."
            )
        cutoff = None if older_than_days is None else self._time() - older_than_days * 86400.0
        current = runtime_versions()
        types = dict(cfg_types or {})
        removed = 0
        for layer, rel in list(self._walk([self._store])):
            data = self._read(layer, rel)
            if data is None:  # gone, or not a file one can read (a FIFO, a huge file)
                removed += self._delete(rel) if invalid else 0
                continue
            entry = self._decode(layer, rel, data)
            if entry is None:
                stale = other_versions or invalid
            else:
                too_old = cutoff is not None and entry.created < cutoff
                stale = too_old or (other_versions and entry.versions != current)
                cfg_type = types.get(entry.op_id) or types.get(entry.op_id.rpartition("@")[0])
                if invalid and not stale and cfg_type is not None:
                    stale = self._build(entry, cfg_type) is None
            if stale:
                removed += self._delete(rel)
        self._store.remove_temporaries(older_than_s=temp_older_than_s)
        return removed

    # --- sharing ------------------------------------------------------------------

    def export(self, file: str | os.PathLike[str], *, readonly_layers: bool = False) -> int:
        """Writes every entry to one JSON file (a path or a URL); returns how many.

        The file can be imported (`import_`), merged, or used as a read-only layer.
        """
        return export(self, os.fspath(file), readonly_layers, exported=self._time())

    def import_(self, file: str | os.PathLike[str], *, provenance: Provenance = "imported") -> int:
        """Adds the entries of an export file, marked with `provenance`. Where this
        cache already holds a newer entry for a key, that one is kept (and a fully tuned
        one over one tuned under a first-call budget). Returns how many entries were
        written.

        Raises:
          OSError: the file cannot be read.
          ValueError: it is not a kerneltune export (or breaks the limits of
            `files.read_json`), or `provenance` is not allowed.
        """
        check_provenance(provenance)
        entries = entries_of_file(os.fspath(file), self._warn)
        return sum(
            self._add_if_newer(dataclasses.replace(e, provenance=provenance)) for e in entries
        )

    def merge(self, *sources: str | os.PathLike[str] | CacheSharing) -> int:
        """Adds the entries of other caches: directories, URLs, export files (`*.json`)
        or `PersistentCache`s. On a conflict the newer entry wins (a fully tuned one
        over one tuned under a first-call budget, whatever their ages). Returns how
        many entries were written.

        Raises:
          OSError: an export file cannot be read, or a local directory does not exist.
          ValueError: a `*.json` source is not a kerneltune export.
        """
        written = 0
        for source in sources:
            if isinstance(source, CacheSharing):
                entries: Iterable[CacheEntry] = source.entries()
            elif os.fspath(source).endswith(storage.ENTRY_SUFFIX):
                entries = entries_of_file(os.fspath(source), self._warn)
            elif "://" not in os.fspath(source) and not os.path.isdir(source):
                raise FileNotFoundError(f"no cache directory at {os.fspath(source)!r}")
            else:
                entries = type(self)(source).entries()
            written += sum(self._add_if_newer(e) for e in entries)
        return written

    def _add_if_newer(self, entry: CacheEntry) -> int:
        if entry.untuned:  # a listing, not a tuned config (see `Entry.untuned`)
            return 0
        rel = entry_relpath(*entry.key)
        data = self._read(self._store, rel)
        current = None if data is None else self._decode(self._store, rel, data)
        if current is not None:
            # A full search beats a first-call budget's, whatever their ages; among
            # equals, the newer one wins.
            if (current.budgeted, -current.created) <= (entry.budgeted, -entry.created):
                return 0
        self._write(entry)
        return 1


class _Entries(Protocol):
    def entries(self, *, readonly_layers: bool = False) -> Iterable[CacheEntry]: ...


def export(cache: _Entries, location: str, readonly_layers: bool, *, exported: float) -> int:
    """Writes every entry of `cache` to one export file; returns how many."""
    docs = [e.to_document() for e in cache.entries(readonly_layers=readonly_layers)]
    docs.sort(key=lambda d: (d["op_id"], d["dev"], d["call_key"]))
    storage.write_export_file(location, docs, exported=exported)
    return len(docs)


def entries_of_file(location: str, warn: Callable[[str, str], None]) -> list[CacheEntry]:
    """The valid entries of an export file; each invalid one is reported to `warn`.

    Raises:
      OSError: the file cannot be read.
      ValueError: it is not a kerneltune export, or breaks the reader's limits.
    """
    try:
        docs = storage.read_export_file(location)
    except ValueError as e:
        # The caller named the file (`merge` takes several at once): the error says
        # which one, as an OSError's does. An UnreadableFile stays one; other
        # ValueErrors (some take more than a message) become plain ones.
        error = files.UnreadableFile if isinstance(e, files.UnreadableFile) else ValueError
        raise error(f"{location}: {e}") from None
    entries = []
    for i, doc in enumerate(docs):
        try:
            entries.append(entry_from_document(doc, f"{location}#{i}"))
        except BadEntry as e:
            warn(f"{location}#{i}", str(e))
    return entries
