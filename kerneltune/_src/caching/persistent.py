"""The persistent config cache: tuned configs that survive the process.

Every entry is one small JSON document at a path derived from a hash of its key
`(device_fingerprint, "<op_id>@v<version>", call_key)`, so a lookup reads one file
(O(1) in the number of entries) and writers never rewrite each other's files. Writes are
atomic (see `storage.py`). Loading never runs code: the config type comes from the
caller (the kernel), never from the file; an entry that cannot be read or no longer fits
that type is skipped with one warning and the key is retuned.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic

from kerneltune._src.caching import cache_entry, cache_sharing, storage
from kerneltune._src.caching.cache_entry import BadEntry, CacheEntry, Provenance
from kerneltune._src.caching.storage import default_cache_dir as default_cache_dir
from kerneltune._src.core import files, options
from kerneltune._src.core.call_shapes import CallShape
from kerneltune._src.core.kernel_types import Cfg
from kerneltune._src.core.keys import config_from_dict, config_to_dict
from kerneltune._src.tuning.report import TuningReport

logger = logging.getLogger("kerneltune")


_now = time.time  # tests patch it to control which entry is newer


class PersistentCache(cache_sharing.CacheSharing, Generic[Cfg]):
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
      >>> cache.put("cpu|cpu", "matmul@v1", "k1", {"block_m": 64})  # returns what is stored
      {'block_m': 64}
      >>> cache.get("cpu|cpu", "matmul@v1", "k1")
      {'block_m': 64}
      >>> cache.clear()
      1
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        readonly: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] = (),
        fsync: bool = True,
    ):
        # One location is one layer (a string is not a list of one-letter layers).
        if isinstance(readonly, (str, os.PathLike)):
            layers = [os.fspath(readonly)]
        else:
            layers = [os.fspath(p) for p in readonly]
        if path is None:
            configured = options.CACHE_DIR.value
            if configured is None:
                raise ValueError(
                    "the persistent cache is off (KERNELTUNE_CACHE_DIR=off); pass a path, "
                    "or use default_persistent_cache(), which returns None when it is off."
                )
            path = configured or storage.default_cache_dir()
            layers += options.CACHE_READONLY.value
        self.location = os.fspath(path)
        self._store = storage.open_store(
            storage.join(self.location, storage.ENTRIES_DIR), fsync=fsync
        )
        self._layers: list[storage.Store] = [self._store]
        for layer in layers:
            try:
                self._layers.append(storage.open_readonly(layer, cache_entry.relpath_of_document))
            except ValueError as e:
                logger.warning("Skipping the read-only kerneltune cache %s: %s", layer, e)
        self.readonly_locations = tuple(layers)
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str]] = set()
        # Entries whose write failed, kept for this process (a lookup sees them first).
        # Each write is tried on its own: one unwritable path does not turn the rest off.
        self._unwritten: dict[str, bytes] = {}
        self._write_failed = False

    def __repr__(self) -> str:
        extra = f", readonly={list(self.readonly_locations)}" if self.readonly_locations else ""
        return f"PersistentCache({self.location!r}{extra})"

    def _time(self) -> float:
        return _now()

    @property
    def memory_only(self) -> bool:
        """True when some entries could not be written and live in this process only."""
        return bool(self._unwritten)

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
        rel = cache_entry.entry_relpath(dev, op_id, call_key)
        for layer, data in self._lookup(rel):
            found = self._usable(layer, rel, data, (dev, op_id, call_key), cfg_type)
            if found is not None:
                return found
        return None

    def _usable(
        self,
        layer: storage.Store,
        rel: str,
        data: bytes,
        key: tuple[str, str, str],
        cfg_type: type | None,
    ) -> tuple[CacheEntry, Any] | None:
        entry = self._decode(layer, rel, data)
        if entry is None:
            return None
        if entry.key != key:
            self._warn(layer.full_path(rel), f"it holds another key, {entry.key}")
            return None
        if cfg_type is None:
            return entry, dict(entry.cfg)
        cfg = self._build(entry, cfg_type)
        return None if cfg is None else (entry, cfg)

    def _lookup(self, rel: str) -> Iterator[tuple[storage.Store, bytes]]:
        data = self._unwritten.get(rel)
        if data is not None:
            yield self._store, data
        for layer in self._layers:
            data = self._read(layer, rel)
            if data is not None:
                yield layer, data

    def _read(self, layer: storage.Store, rel: str) -> bytes | None:
        if layer is self._store and rel in self._unwritten:
            return self._unwritten.get(rel)
        try:
            return layer.read(rel)
        except Exception as e:  # a broken layer is a miss, never a crash.
            self._warn(layer.full_path(rel), f"it cannot be read ({type(e).__name__}: {e})")
            return None

    def _decode(self, layer: storage.Store, rel: str, data: bytes) -> CacheEntry | None:
        path = layer.full_path(rel)
        try:
            doc = files.loads(data, max_bytes=files.MAX_ENTRY_BYTES)
            return cache_entry.entry_from_document(doc, path)
        except (BadEntry, files.UnreadableFile) as e:
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

    def entries(
        self, *, readonly_layers: bool = False, op_id: str | None = None
    ) -> Iterator[CacheEntry]:
        """Every readable entry of the writable layer, then of the read-only layers when
        asked (an entry shadowed by an earlier layer is left out, as `get` would); with
        `op_id` ("matmul@v3"), only that op's entries (read from its folder alone).
        Unreadable entries are skipped with a warning."""
        seen: set[str] = set()
        layers = self._layers if readonly_layers else [self._store]
        under = "" if op_id is None else cache_entry.op_dirname(op_id)
        for layer, rel in self._walk(layers, under):
            if rel in seen:
                continue
            data = self._read(layer, rel)
            entry = None if data is None else self._decode(layer, rel, data)
            if entry is not None:
                seen.add(rel)
                yield entry

    def _walk(
        self, layers: Iterable[storage.Store], under: str = ""
    ) -> Iterator[tuple[storage.Store, str]]:
        with self._lock:
            unwritten = sorted(rel for rel in self._unwritten if rel.startswith(under))
        yield from ((self._store, rel) for rel in unwritten)
        for layer in layers:
            try:
                yield from ((layer, rel) for rel in layer.walk(under))
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
        exclusive: bool = False,
        shape: CallShape | None = None,
    ) -> Any:
        """Stores a tuned config, atomically.

        Args:
          dev: the device fingerprint.
          op_id: the "<op_id>@v<version>" string.
          call_key: the call key.
          cfg: the config: a dataclass instance (or a mapping of its fields).
          report: the tuning report; every candidate's timings and errors are kept.
          provenance: "autotuned", "imported" or "shipped".
          signature: a readable description of the call, shown by `kerneltune cache ls`.
          exclusive: publish only when the writable layer holds no valid entry for the
            key yet (an entry tuned under a first-call budget gives way to a full one).
            Processes that missed the same key and tuned it at once then agree on the
            first one's config: the one returned.
          shape: the call's sizes and size-free family (`Invocation.shape`), which
            warm start reads to find the tuned neighbours of a new call.

        Returns:
          The config now stored for the key: `cfg`, or with `exclusive` the valid entry
          another process published first (as `cfg`'s type, or a dict of fields).

        Raises:
          ValueError: `provenance` is not one of the allowed values.
          TypeError: `cfg` is not a dataclass instance or a mapping.

        A config that would not come back equal from JSON is not stored (with a
        warning). When an entry cannot be written, it is kept in memory for this
        process (with a warning) and later writes are still tried.
        """
        cache_entry.check_provenance(provenance)
        fields = config_to_dict(cfg)
        if not cache_entry.round_trips(cfg, fields, op_id):
            return cfg
        entry = CacheEntry(
            op_id,
            call_key,
            fields,
            dev=dev,
            provenance=provenance,
            signature=signature or "",
            shape=shape,
            created=_now(),
            versions=cache_entry.runtime_versions(),
            cfg_type="" if isinstance(cfg, Mapping) else cache_entry.type_name(cfg),
            **cache_entry.report_fields(report),
        )
        if exclusive:
            if self._write(entry, exclusive=True):
                return cfg
            cfg_type = None if isinstance(cfg, Mapping) else type(cfg)
            rel, key = cache_entry.entry_relpath(dev, op_id, call_key), (dev, op_id, call_key)
            data = self._read(self._store, rel)
            found = None if data is None else self._usable(self._store, rel, data, key, cfg_type)
            if found is not None and not (found[0].budgeted and not entry.budgeted):
                return found[1]
            # The entry there is unusable (corrupt, or does not fit the type) or was tuned
            # under a first-call budget, which a full search completes: replace it.
        self._write(entry)
        return cfg

    def _write(self, entry: CacheEntry, *, exclusive: bool = False) -> bool:
        rel = cache_entry.entry_relpath(entry.dev, entry.op_id, entry.call_key)
        data = json.dumps(entry.to_document(), sort_keys=True, allow_nan=False).encode()
        try:
            written = self._store.write(rel, data, exclusive=exclusive)
        except Exception as e:  # any backend error: degrade for this entry, never crash.
            with self._lock:
                self._unwritten[rel] = data
                first = not self._write_failed
                self._write_failed = True
            # Once per cache: a location that is not writable at all would say it for
            # every entry. Later writes are still tried, one by one.
            (logger.warning if first else logger.debug)(
                "Cannot write to the kerneltune cache at %s (%s: %s); such entries are "
                "kept in memory for this process only.",
                self._store.full_path(rel),
                type(e).__name__,
                e,
            )
            return True
        if written:
            with self._lock:
                self._unwritten.pop(rel, None)
        return written

    def delete(self, dev: str, op_id: str, call_key: str) -> bool:
        """Removes one entry from the writable layer; False when it was not there."""
        return bool(self._delete(cache_entry.entry_relpath(dev, op_id, call_key)))

    def _delete(self, rel: str) -> int:
        with self._lock:
            in_memory = self._unwritten.pop(rel, None) is not None
        try:
            on_disk = self._store.delete(rel)
        except Exception as e:
            logger.warning("Cannot delete %s: %s", self._store.full_path(rel), e)
            on_disk = False
        return int(in_memory or on_disk)
