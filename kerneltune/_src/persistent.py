"""The persistent config cache: tuned configs that survive the process.

Every entry is one small JSON document at a path derived from a hash of its key
`(device_fingerprint, "<op_id>@v<version>", call_key)`, so a lookup reads one file
(O(1) in the number of entries) and writers never rewrite each other's files. Writes are
atomic (see `storage.py`). Loading never runs code: the config type comes from the
caller (the kernel), never from the file; an entry that cannot be read or no longer fits
that type is skipped with one warning and the key is retuned.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic

from kerneltune._src import cache_entry, options, storage
from kerneltune._src.cache_entry import (
    PROVENANCES,
    BadEntry,
    CacheEntry,
    Provenance,
    entry_from_document,
    entry_relpath,
    op_matches,
    runtime_versions,
)
from kerneltune._src.kernel_types import Cfg
from kerneltune._src.keys import config_from_dict, config_to_dict
from kerneltune._src.tuning.report import TuningReport

logger = logging.getLogger("kerneltune")


_ENTRIES_DIR = "configs"
_TEMP_MAX_AGE_S = 3600.0
_now = time.time  # tests patch it to control which entry is newer


class PersistentCache(Generic[Cfg]):
    """Tuned configs on disk or behind a URL, shared by processes, hosts and runs.

    Args:
      path: a directory or a URL (`gs://`, `s3://`, `memory://`, `file://`; remote
        protocols need their fsspec driver). None: `KERNELTUNE_CACHE_DIR`, else the
        user cache directory (e.g. `~/.cache/kerneltune`). Entries live under
        `<path>/configs/`.
      readonly: read-only layers consulted, in order, after `path`: cache directories,
        URLs, or export files (`*.json`, see `export`) such as a cache shipped inside a
        package. When `path` is None, the layers listed in `KERNELTUNE_CACHE_READONLY`
        come after these.
      fsync: flush each entry to the disk before it becomes visible, so that a machine
        crash cannot lose it (about a millisecond per put on a local disk).

    Raises:
      ValueError: `path` is None and `KERNELTUNE_CACHE_DIR=off`, or the URL's protocol
        cannot be opened.

    Example:
      >>> cache = PersistentCache("memory://kerneltune-doc")
      >>> cache.put("cpu|cpu", "matmul@v1", "k1", {"block_m": 64})
      >>> cache.get("cpu|cpu", "matmul@v1", "k1")
      {'block_m': 64}
      >>> cache.clear()
      1
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        readonly: Sequence[str | os.PathLike[str]] = (),
        fsync: bool = True,
    ):
        layers = [os.fspath(p) for p in readonly]
        if path is None:
            configured = options.get("cache_dir")
            if configured is None:
                raise ValueError(
                    "the persistent cache is off (KERNELTUNE_CACHE_DIR=off); pass a path, "
                    "or use default_persistent_cache(), which returns None when it is off."
                )
            path = configured or default_cache_dir()
            layers += options.get("cache_readonly")
        self.location = os.fspath(path)
        self._store = storage.open_store(_join(self.location, _ENTRIES_DIR), fsync=fsync)
        self._layers: list[storage.Store] = [self._store]
        for layer in layers:
            try:
                self._layers.append(_open_readonly(layer))
            except ValueError as e:
                logger.warning("Skipping the read-only kerneltune cache %s: %s", layer, e)
        self.readonly_locations = tuple(layers)
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str]] = set()
        # Set after a write failed: this process's new entries, kept in memory only.
        self._memory: dict[str, bytes] | None = None

    def __repr__(self) -> str:
        extra = f", readonly={list(self.readonly_locations)}" if self.readonly_locations else ""
        return f"PersistentCache({self.location!r}{extra})"

    @property
    def memory_only(self) -> bool:
        """True after a write failed: new entries are kept in this process only."""
        return self._memory is not None

    # --- lookups ------------------------------------------------------------------

    def get(
        self, dev: str, op_id: str, call_key: str, cfg_type: type[Cfg] | None = None
    ) -> Cfg | dict[str, Any] | None:
        """The stored config for a key, or None.

        Args:
          dev: the device fingerprint.
          op_id: the "<op_id>@v<version>" string.
          call_key: the call key.
          cfg_type: the kernel's config type; the result is an instance of it. None:
            the config's fields as a dict.

        Returns:
          The config, or None when no layer holds a usable entry. Entries that are
          unreadable or no longer fit `cfg_type` are skipped with one warning each.
        """
        found = self._find(dev, op_id, call_key, cfg_type)
        return None if found is None else found[1]

    def get_entry(
        self, dev: str, op_id: str, call_key: str, *, cfg_type: type | None = None
    ) -> CacheEntry | None:
        """The first usable entry for a key across the layers, with all its data
        (candidate timings, provenance, versions, where it is stored).

        With `cfg_type`, an entry whose config does not fit that type is skipped (with
        a warning) and the next layer is consulted, as `get` does.
        """
        found = self._find(dev, op_id, call_key, cfg_type)
        return None if found is None else found[0]

    def _find(
        self, dev: str, op_id: str, call_key: str, cfg_type: type | None
    ) -> tuple[CacheEntry, Any] | None:
        rel = entry_relpath(dev, op_id, call_key)
        for layer, data in self._lookup(rel):
            entry = self._decode(layer, rel, data)
            if entry is None:
                continue
            if entry.key != (dev, op_id, call_key):
                self._warn(layer.full_path(rel), f"it holds another key, {entry.key}")
                continue
            if cfg_type is None:
                return entry, dict(entry.cfg)
            cfg = self._build(entry, cfg_type)
            if cfg is not None:
                return entry, cfg
        return None

    def _lookup(self, rel: str) -> Iterator[tuple[storage.Store, bytes]]:
        memory = self._memory
        data = None if memory is None else memory.get(rel)
        if data is not None:
            yield self._store, data
        for layer in self._layers:
            data = self._read(layer, rel)
            if data is not None:
                yield layer, data

    def _read(self, layer: storage.Store, rel: str) -> bytes | None:
        memory = self._memory
        if layer is self._store and memory is not None and rel in memory:
            return memory.get(rel)
        try:
            return layer.read(rel)
        except Exception as e:  # a broken layer is a miss, never a crash.
            self._warn(layer.full_path(rel), f"it cannot be read ({type(e).__name__}: {e})")
            return None

    def _decode(self, layer: storage.Store, rel: str, data: bytes) -> CacheEntry | None:
        path = layer.full_path(rel)
        try:
            if not data.strip():
                raise BadEntry("the file is empty")
            try:
                doc = json.loads(data)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise BadEntry(f"it is not valid JSON ({e})") from None
            return entry_from_document(doc, path)
        except BadEntry as e:
            self._warn(path, str(e))
            return None

    def _build(self, entry: CacheEntry, cfg_type: type[Cfg]) -> Cfg | None:
        try:
            return config_from_dict(entry.cfg, cfg_type)
        except Exception as e:  # includes the config's own validation.
            self._warn(entry.path, f"its config no longer fits {cfg_type.__qualname__} ({e})")
            return None

    def _warn(self, path: str, why: str) -> None:
        with self._lock:
            if (path, why) in self._warned:
                return
            self._warned.add((path, why))
        logger.warning(
            "Skipping kerneltune cache entry %s: %s; the key will be retuned.", path, why
        )

    def __contains__(self, key: object) -> bool:
        if not (isinstance(key, tuple) and len(key) == 3):
            return False
        return self._find(*key, cfg_type=None) is not None

    def __len__(self) -> int:
        """The number of entries in the writable layer (read-only layers not counted)."""
        return len({rel for _, rel in self._walk([self._store])})

    def entries(self, *, readonly_layers: bool = False) -> Iterator[CacheEntry]:
        """Every readable entry of the writable layer, then of the read-only layers when
        asked (an entry shadowed by an earlier layer is left out, as `get` would).
        Unreadable entries are skipped with a warning."""
        seen: set[str] = set()
        for layer, rel in self._walk(self._layers if readonly_layers else [self._store]):
            if rel in seen:
                continue
            data = self._read(layer, rel)
            entry = None if data is None else self._decode(layer, rel, data)
            if entry is not None:
                seen.add(rel)
                yield entry

    def _walk(self, layers: Iterable[storage.Store]) -> Iterator[tuple[storage.Store, str]]:
        memory = self._memory
        if memory is not None:
            with self._lock:
                in_memory = sorted(memory)
            yield from ((self._store, rel) for rel in in_memory)
        for layer in layers:
            try:
                yield from ((layer, rel) for rel in layer.walk())
            except Exception as e:
                logger.warning("Cannot list the kerneltune cache %s: %s", layer.location, e)

    # --- writes -------------------------------------------------------------------

    def put(
        self,
        dev: str,
        op_id: str,
        call_key: str,
        cfg: Any,
        *,
        report: TuningReport | None = None,
        provenance: Provenance = "autotuned",
        signature: str | None = None,
    ) -> None:
        """Stores a tuned config, atomically.

        Args:
          dev: the device fingerprint.
          op_id: the "<op_id>@v<version>" string.
          call_key: the call key.
          cfg: the config: a dataclass instance (or a mapping of its fields).
          report: the tuning report; every candidate's timings and errors are kept.
          provenance: "autotuned", "imported" or "shipped".
          signature: a readable description of the call, shown by `kerneltune cache ls`.

        Raises:
          ValueError: `provenance` is not one of the allowed values.
          TypeError: `cfg` is not a dataclass instance or a mapping.

        A config that would not come back equal from JSON is not stored (with a
        warning). When the location cannot be written, the cache keeps this process's
        entries in memory and says so once.
        """
        if provenance not in PROVENANCES:
            raise ValueError(
                f"provenance must be one of {list(PROVENANCES)}, got {provenance!r} "
                "(heuristic configs are never stored as tuned)."
            )
        fields = config_to_dict(cfg)
        if not _round_trips(cfg, fields, op_id):
            return
        entry = CacheEntry(
            dev=dev,
            op_id=op_id,
            call_key=call_key,
            cfg=fields,
            provenance=provenance,
            signature=signature,
            created=_now(),
            versions=runtime_versions(),
            cfg_type=None if isinstance(cfg, Mapping) else cache_entry.type_name(cfg),
            **cache_entry.report_fields(report),
        )
        self._write(entry)

    def _write(self, entry: CacheEntry) -> None:
        rel = entry_relpath(entry.dev, entry.op_id, entry.call_key)
        data = json.dumps(entry.to_document(), sort_keys=True, allow_nan=False).encode()
        if self._memory is None:
            try:
                self._store.write(rel, data)
                return
            except Exception as e:  # any backend error: degrade, never crash.
                with self._lock:
                    first = self._memory is None
                    if first:
                        self._memory = {}
                if first:
                    logger.warning(
                        "Cannot write to the kerneltune cache at %s (%s: %s); tuned configs "
                        "are kept in memory for this process only.",
                        self._store.location,
                        type(e).__name__,
                        e,
                    )
        with self._lock:
            assert self._memory is not None
            self._memory[rel] = data

    def delete(self, dev: str, op_id: str, call_key: str) -> bool:
        """Removes one entry from the writable layer; False when it was not there."""
        return bool(self._delete(entry_relpath(dev, op_id, call_key)))

    def _delete(self, rel: str) -> int:
        with self._lock:
            in_memory = self._memory is not None and self._memory.pop(rel, None) is not None
        try:
            on_disk = self._store.delete(rel)
        except Exception as e:
            logger.warning("Cannot delete %s: %s", self._store.full_path(rel), e)
            on_disk = False
        return int(in_memory or on_disk)

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
        temp_older_than_s: float = _TEMP_MAX_AGE_S,
    ) -> int:
        """Removes stale entries from the writable layer; returns how many.

        Args:
          older_than_days: remove entries written more than this many days ago.
          other_versions: remove entries written by another kerneltune, jax or jaxlib
            version, and entries this version cannot read (other schemas, corrupt).
          temp_older_than_s: temporary files left behind by killed writers are removed
            once they are this old (they are not counted).
        """
        cutoff = None if older_than_days is None else _now() - older_than_days * 86400.0
        current = runtime_versions()
        removed = 0
        for layer, rel in list(self._walk([self._store])):
            data = self._read(layer, rel)
            if data is None:
                continue
            entry = self._decode(layer, rel, data)
            if entry is None:
                stale = other_versions
            else:
                too_old = cutoff is not None and entry.created < cutoff
                stale = too_old or (other_versions and entry.versions != current)
            if stale:
                removed += self._delete(rel)
        self._store.remove_temporaries(older_than_s=temp_older_than_s)
        return removed

    # --- sharing ------------------------------------------------------------------

    def export(self, file: str | os.PathLike[str], *, readonly_layers: bool = False) -> int:
        """Writes every entry to one JSON file (a path or a URL); returns how many.

        The file can be imported (`import_`), merged, or used as a read-only layer.
        """
        docs = [e.to_document() for e in self.entries(readonly_layers=readonly_layers)]
        docs.sort(key=lambda d: (d["op_id"], d["dev"], d["call_key"]))
        storage.write_export_file(os.fspath(file), docs, exported=_now())
        return len(docs)

    def import_(self, file: str | os.PathLike[str], *, provenance: Provenance = "imported") -> int:
        """Adds the entries of an export file, marked with `provenance`. Where this
        cache already holds a newer entry for a key, that one is kept. Returns how many
        entries were written.

        Raises:
          OSError: the file cannot be read.
          ValueError: it is not a kerneltune export, or `provenance` is not allowed.
        """
        if provenance not in PROVENANCES:
            raise ValueError(f"provenance must be one of {list(PROVENANCES)}, got {provenance!r}.")
        entries = self._entries_of_file(os.fspath(file))
        return sum(
            self._add_if_newer(dataclasses.replace(e, provenance=provenance)) for e in entries
        )

    def merge(self, *sources: str | os.PathLike[str] | PersistentCache[Any]) -> int:
        """Adds the entries of other caches: directories, URLs, export files (`*.json`)
        or `PersistentCache`s. On a conflict the newer entry wins. Returns how many
        entries were written.

        Raises:
          OSError: an export file cannot be read, or a local directory does not exist.
          ValueError: a `*.json` source is not a kerneltune export.
        """
        written = 0
        for source in sources:
            if isinstance(source, PersistentCache):
                entries: Iterable[CacheEntry] = source.entries()
            elif os.fspath(source).endswith(storage.ENTRY_SUFFIX):
                entries = self._entries_of_file(os.fspath(source))
            elif "://" not in os.fspath(source) and not os.path.isdir(source):
                raise FileNotFoundError(f"no cache directory at {os.fspath(source)!r}")
            else:
                entries = PersistentCache(source).entries()
            written += sum(self._add_if_newer(e) for e in entries)
        return written

    def _entries_of_file(self, location: str) -> list[CacheEntry]:
        entries = []
        for i, doc in enumerate(storage.read_export_file(location)):
            try:
                entries.append(entry_from_document(doc, f"{location}#{i}"))
            except BadEntry as e:
                self._warn(f"{location}#{i}", str(e))
        return entries

    def _add_if_newer(self, entry: CacheEntry) -> int:
        rel = entry_relpath(*entry.key)
        data = self._read(self._store, rel)
        current = None if data is None else self._decode(self._store, rel, data)
        if current is not None and current.created >= entry.created:
            return 0
        self._write(entry)
        return 1


def _round_trips(cfg: Any, fields: dict[str, Any], op_id: str) -> bool:
    try:
        text = json.dumps(fields, allow_nan=False)
        if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
            ok = config_from_dict(json.loads(text), type(cfg)) == cfg
        else:
            ok = json.loads(text) == fields
        why = "it comes back different"
    except Exception as e:
        ok, why = False, f"{type(e).__name__}: {e}"
    if not ok:
        logger.warning(
            "Not persisting the config %r of %s: it does not survive a JSON round trip "
            "(%s). Config fields should be numbers, strings, bools, None, tuples, enums "
            "or nested dataclasses.",
            cfg,
            op_id,
            why,
        )
    return ok


def _join(location: str, name: str) -> str:
    if "://" in location:
        return location.rstrip("/") + "/" + name
    return os.path.join(os.path.expanduser(location), name)


def _open_readonly(location: str) -> storage.Store:
    if location.endswith(storage.ENTRY_SUFFIX):
        return storage.BundleStore(location, cache_entry.relpath_of_document)
    return storage.open_store(_join(location, _ENTRIES_DIR))


def default_cache_dir() -> str:
    """The user cache directory used when `KERNELTUNE_CACHE_DIR` is unset."""
    try:
        import platformdirs
    except ImportError:
        # Minimal environments (e.g. a GPU image with its own site-packages): the XDG
        # location that platformdirs would give on Linux.
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "kerneltune")
    return platformdirs.user_cache_dir("kerneltune", appauthor=False)


_defaults: dict[tuple[str, tuple[str, ...]], PersistentCache[Any]] = {}
_defaults_lock = threading.Lock()


def default_persistent_cache() -> PersistentCache[Any] | None:
    """The cache at `KERNELTUNE_CACHE_DIR` (default: the user cache directory) with
    the read-only layers of `KERNELTUNE_CACHE_READONLY`; None when the variable is
    "off", or when the location cannot be opened (with a warning). One instance per
    location, so that each problem is reported once per process."""
    configured = options.get("cache_dir")
    if configured is None:
        return None
    key = (configured or default_cache_dir(), tuple(options.get("cache_readonly")))
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
