"""Where persistent-cache entries live: a local directory, a URL, or an export bundle.

A store maps relative paths (`"<op>/<ab>/<digest>.json"`) to small byte strings. The
cache never reads, modifies and rewrites a shared file: every entry is its own file,
written whole, so concurrent writers (threads, processes, hosts on shared storage) can
at worst replace each other's version of the same entry, never tear it.

- `LocalStore`: a directory. Writes go through `files.write_atomic` (a temporary file in
  the entry's directory, renamed over the entry: atomic on POSIX and Windows, and on
  NFS within one directory), so a reader sees the old entry or the new one; reads go
  through `files.read_bytes` (regular files only, never blocking, bounded in size).
- `FsspecStore`: any URL fsspec understands (`gs://`, `s3://`, `memory://`, ...). Object
  stores make an uploaded object visible whole, so entries are uploaded in one call;
  other filesystems get the same temporary-file-then-move treatment as a directory.
- `BundleStore`: one JSON export file, read-only (a cache shipped inside a package).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from kerneltune._src.core import files

logger = logging.getLogger("kerneltune")

ENTRY_SUFFIX = ".json"
ENTRIES_DIR = "configs"  # entries live under <cache location>/configs/

# Protocols whose writes are whole-object uploads: a reader never sees a partial object.
_OBJECT_STORE_PROTOCOLS = frozenset(
    {"gs", "gcs", "s3", "s3a", "az", "abfs", "abfss", "adl", "oci", "memory"}
)


class Store(Protocol):
    """Storage for cache entries, addressed by relative paths using "/"."""

    location: str
    writable: bool

    def read(self, rel: str) -> bytes | None:
        """The entry's bytes, or None when there is none. Raises OSError on other errors."""
        ...

    def write(self, rel: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Writes the entry atomically (readers see all of it or none of it). With
        `exclusive`, only when there is no entry yet; returns whether it wrote."""
        ...

    def delete(self, rel: str) -> bool:
        """Removes the entry; False when there was none."""
        ...

    def walk(self, under: str = "") -> Iterator[str]:
        """The relative path of every entry (never of temporary files); with `under`,
        of those in that folder only."""
        ...

    def full_path(self, rel: str) -> str:
        """The path or URL shown to users for an entry."""
        ...

    def remove_temporaries(self, older_than_s: float) -> int:
        """Removes temporary files left by killed writers; returns how many."""
        ...


def _is_entry_name(name: str) -> bool:
    return name.endswith(ENTRY_SUFFIX) and not name.startswith(".")


def _temp_rel(rel: str) -> str:
    head, _, name = rel.rpartition("/")
    temp = files.temp_name(name)
    return f"{head}/{temp}" if head else temp


class LocalStore:
    """A directory on a local or network filesystem."""

    writable = True

    def __init__(self, root: str, *, fsync: bool = True):
        self.root = os.path.abspath(os.path.expanduser(root))
        self.location = self.root
        self.fsync = fsync

    def full_path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def read(self, rel: str) -> bytes | None:
        try:
            return files.read_bytes(self.full_path(rel), max_bytes=files.MAX_ENTRY_BYTES)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write(self, rel: str, data: bytes, *, exclusive: bool = False) -> bool:
        return files.write_atomic(self.full_path(rel), data, fsync=self.fsync, exclusive=exclusive)

    def delete(self, rel: str) -> bool:
        try:
            os.unlink(self.full_path(rel))
        except FileNotFoundError:
            return False
        self._remove_empty_parents(rel)
        return True

    def _remove_empty_parents(self, rel: str) -> None:
        parts = rel.split("/")[:-1]
        while parts:
            try:
                os.rmdir(self.full_path("/".join(parts)))
            except OSError:
                return  # not empty (or already gone): stop climbing
            parts.pop()

    def _scan(self, want: Callable[[str], bool], under: str = "") -> Iterator[tuple[str, str]]:
        top = self.full_path(under) if under else self.root
        if not os.path.isdir(top):
            return
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for name in sorted(filenames):
                if want(name):
                    rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                    yield rel, os.path.join(dirpath, name)

    def walk(self, under: str = "") -> Iterator[str]:
        for rel, _ in self._scan(_is_entry_name, under):
            yield rel

    def remove_temporaries(self, older_than_s: float) -> int:
        removed = 0
        cutoff = time.time() - older_than_s
        for rel, path in list(self._scan(files.is_temp)):
            try:
                # A temporary of a writer that died on this host is removed at once;
                # others (other hosts, live writers) once they are old.
                if (
                    files.writer_is_dead(rel.rpartition("/")[2])
                    or os.lstat(path).st_mtime <= cutoff
                ):
                    os.unlink(path)
                    removed += 1
            except FileNotFoundError:
                pass
        return removed


class FsspecStore:
    """A directory behind an fsspec URL (`gs://bucket/dir`, `s3://...`, `memory://...`)."""

    writable = True

    def __init__(self, fs: Any, root: str, url: str):
        self.fs = fs
        self.root = root.rstrip("/")
        self.location = url
        protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        self._object_store = any(p in _OBJECT_STORE_PROTOCOLS for p in protocols)

    def full_path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def read(self, rel: str) -> bytes | None:
        path = self.full_path(rel)
        try:
            size = self.fs.size(path)
            if size is not None and size > files.MAX_ENTRY_BYTES:
                raise files.UnreadableFile(f"it is {size} bytes (at most {files.MAX_ENTRY_BYTES})")
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            return None

    def write(self, rel: str, data: bytes, *, exclusive: bool = False) -> bool:
        path = self.full_path(rel)
        # Object stores have no create-exclusive upload that fsspec exposes everywhere:
        # check first (a race can still let the later writer win; both are valid).
        if exclusive and self.fs.exists(path):
            return False
        if self._object_store:
            self.fs.pipe_file(path, data)
            return True
        self.fs.makedirs(path.rpartition("/")[0], exist_ok=True)
        temp = self.full_path(_temp_rel(rel))
        self.fs.pipe_file(temp, data)
        self.fs.mv(temp, path)
        return True

    def delete(self, rel: str) -> bool:
        try:
            self.fs.rm_file(self.full_path(rel))
        except FileNotFoundError:
            return False
        return True

    def _find(self, under: str = "") -> list[str]:
        top = self.full_path(under) if under else self.root
        try:
            self.fs.invalidate_cache(top)
            return sorted(self.fs.find(top))
        except FileNotFoundError:
            return []

    def walk(self, under: str = "") -> Iterator[str]:
        prefix = self.root + "/"
        for path in self._find(under):
            name = path.rpartition("/")[2]
            if path.startswith(prefix) and _is_entry_name(name):
                yield path[len(prefix) :]

    def remove_temporaries(self, older_than_s: float) -> int:
        # Object stores never see temporaries; elsewhere the age is not always known,
        # so only remove those whose modification time says they are old.
        removed = 0
        cutoff = time.time() - older_than_s
        for path in self._find():
            if not files.is_temp(path.rpartition("/")[2]):
                continue
            try:
                modified = self.fs.modified(path).timestamp()
            except Exception:  # not every filesystem reports it.
                continue
            if modified <= cutoff:
                self.fs.rm_file(path)
                removed += 1
        return removed


class BundleStore:
    """A read-only store over one export file (see `PersistentCache.export`).

    The file is read once, on first use; lookups are then dictionary lookups.
    """

    writable = False

    def __init__(self, location: str, relpath_of: Callable[[dict[str, Any]], str | None]):
        self.location = location
        self._relpath_of = relpath_of
        self._entries: dict[str, bytes] | None = None
        self._lock = threading.Lock()

    def _load(self) -> dict[str, bytes]:
        with self._lock:
            if self._entries is None:
                self._entries = self._read_bundle()
            return self._entries

    def _read_bundle(self) -> dict[str, bytes]:
        try:
            docs = read_export_file(self.location)
        except (OSError, ValueError) as e:
            logger.warning("Skipping the read-only kerneltune cache %s: %s", self.location, e)
            return {}
        entries: dict[str, bytes] = {}
        for doc in docs:
            rel = self._relpath_of(doc) if isinstance(doc, dict) else None
            if rel is not None:
                entries[rel] = json.dumps(doc).encode()
        return entries

    def full_path(self, rel: str) -> str:
        return f"{self.location}#{rel}"

    def read(self, rel: str) -> bytes | None:
        return self._load().get(rel)

    def write(self, rel: str, data: bytes, *, exclusive: bool = False) -> bool:
        raise PermissionError(f"{self.location} is a read-only cache bundle.")

    def delete(self, rel: str) -> bool:
        raise PermissionError(f"{self.location} is a read-only cache bundle.")

    def walk(self, under: str = "") -> Iterator[str]:
        prefix = under.rstrip("/") + "/" if under else ""
        yield from sorted(rel for rel in self._load() if rel.startswith(prefix))

    def remove_temporaries(self, older_than_s: float) -> int:
        return 0


EXPORT_KIND = "kerneltune.cache_export"


def read_export_file(location: str) -> list[Any]:
    """The entry documents of an export file (a path or a URL), not yet validated.

    Raises:
      OSError: the file cannot be read.
      ValueError: it is not a kerneltune export file, or it breaks the limits of
        `files.read_json` (size, depth, integer length; regular files only).
    """
    doc = files.read_json_url(location)
    if not isinstance(doc, dict) or doc.get("kind") != EXPORT_KIND:
        raise ValueError(f"not a kerneltune cache export (expected kind {EXPORT_KIND!r})")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise ValueError("its 'entries' is not a list")
    return entries


def write_export_file(location: str, docs: list[dict[str, Any]], *, exported: float) -> None:
    """Writes entry documents as one export file (a path or a URL), atomically where
    the location is a local file."""
    import fsspec

    data = json.dumps(
        {"kind": EXPORT_KIND, "schema": 1, "exported": exported, "entries": docs},
        indent=1,
        sort_keys=True,
        allow_nan=False,
    ).encode()
    fs, path = fsspec.core.url_to_fs(location)
    if _is_local(fs):
        files.write_atomic(path, data)
    else:
        fs.pipe_file(path, data)


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def open_store(location: str, *, fsync: bool = True) -> Store:
    """A writable store for a directory path or a URL.

    Raises:
      ValueError: the URL's protocol is unknown or its fsspec driver is not installed.
    """
    if "://" not in location:
        return LocalStore(location, fsync=fsync)
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(location)
    except (ImportError, ValueError) as e:
        raise ValueError(
            f"cannot open the cache location {location!r}: {e}. Remote caches use fsspec; "
            "install its driver for this protocol (gcsfs for gs://, s3fs for s3://)."
        ) from None
    if _is_local(fs):
        return LocalStore(root, fsync=fsync)
    return FsspecStore(fs, root, location)


def join(location: str, name: str) -> str:
    """`location/name` for a path or a URL."""
    if "://" in location:
        return location.rstrip("/") + "/" + name
    return os.path.join(os.path.expanduser(location), name)


def open_readonly(location: str, relpath_of: Callable[[dict[str, Any]], str | None]) -> Store:
    """A read-only layer: an export file (`*.json`), or a cache's entry directory."""
    if location.endswith(ENTRY_SUFFIX):
        return BundleStore(location, relpath_of)
    return open_store(join(location, ENTRIES_DIR))


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
