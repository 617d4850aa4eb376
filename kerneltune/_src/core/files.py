"""Reading and writing the files kerneltune keeps, safely.

Everything kerneltune loads (cache entries, exports, results, manifests, command-line
inputs) may come from a shared directory that anyone can write to, so it is read with
limits: regular files only, opened without blocking (a FIFO planted at an entry path
never hangs a reader), rejected by size before a byte is read, and parsed with bounds
on nesting depth and integer length, so that a hostile file costs a warning, never a
crash, a hang or memory out of proportion to the limit.

Everything kerneltune writes goes through `write_atomic`: a temporary file with an
unpredictable name, created exclusively (never through a planted symlink), flushed to
the disk, then renamed over the target, so a reader sees the old file or the new one.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import stat
from typing import Any

import numpy as np

# Large enough for an export of tens of thousands of entries; a single entry is a few
# kB, so the per-entry limit is much lower.
MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_ENTRY_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_INT_DIGITS = 64

TEMP_SUFFIX = ".tmp"
# Not world-writable whatever the umask: entries are replaced by renaming, never
# rewritten in place, so nobody needs write permission on a file.
FILE_MODE = 0o644
DIR_MODE = 0o775


class UnreadableFile(ValueError):
    """A file that kerneltune refuses to load (the message says why, in a few words)."""


#: Bytes the checks below look at in one piece: their memory stays bounded whatever
#: the file holds (a million strings, a million numbers).
_PIECE = 1 << 16
#: Every byte but the digits, made a space: what is left splits into runs of digits.
_DIGITS_ALONE = bytes(b if b in b"0123456789" else 0x20 for b in range(256))


def _depth_ok(data: bytes, limit: int) -> bool:
    """True when brackets nest at most `limit` deep (strings are skipped).

    Vectorised, so that reading the shipped tables (megabytes) costs milliseconds, in
    time linear in the file and memory bounded beyond two copies of it: escaped
    backslashes go first, then escaped quotes (a backslash takes the byte after it, so
    what is left of the quotes opens or closes strings); then, a piece at a time, the
    bytes inside strings are marked (a running parity of quotes) and the brackets
    outside them counted. Exact for valid JSON; on invalid JSON the parser has the
    last word."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return True
    text = np.frombuffer(data.replace(b"\\\\", b"").replace(b'\\"', b""), np.uint8)
    depth, in_string = 0, False
    for start in range(0, text.size, _PIECE):
        piece = text[start : start + _PIECE]
        strings = np.logical_xor.accumulate(piece == 0x22) ^ in_string
        in_string = bool(strings[-1])
        opens = (piece == 0x5B) | (piece == 0x7B)  # [ {
        counted = ~strings & (opens | (piece == 0x5D) | (piece == 0x7D))
        levels = depth + np.cumsum(np.where(opens[counted], 1, -1))
        if levels.size:
            if int(levels.max()) > limit:
                return False
            depth = int(levels[-1])
    return True


def _digits_longer_than(data: bytes, n: int) -> bool:
    """Whether a run of more than `n` digits stands anywhere in `data` (pieces overlap
    by `n` bytes, so such a run lies whole in one)."""
    for start in range(0, len(data), _PIECE):
        piece = data[start : start + _PIECE + n].translate(_DIGITS_ALONE)
        if max(map(len, piece.split()), default=0) > n:
            return True
    return False


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise UnreadableFile(f"it holds a {digits}-digit integer (at most {MAX_INT_DIGITS})")
    return int(text)


def _reject_constant(name: str) -> Any:
    raise UnreadableFile(f"it holds {name}, which is not JSON")


def loads(data: bytes | str, *, max_bytes: int = MAX_FILE_BYTES, depth: int = MAX_DEPTH) -> Any:
    """Parses JSON with the limits of this module.

    Raises:
      UnreadableFile: the text is too long, nests too deep, holds a too long integer or
        NaN/Infinity, or is not JSON.
    """
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise UnreadableFile(f"it is {len(raw)} bytes (at most {max_bytes})")
    if not raw.strip():
        raise UnreadableFile("it is empty")
    if not _depth_ok(raw, depth):
        raise UnreadableFile(f"it nests deeper than {depth} levels")
    try:
        # Integers are checked one by one only where a long run of digits stands
        # somewhere (a string or a float may hold it): a call per integer costs more
        # than the whole parse of a table.
        parse_int = _parse_int if _digits_longer_than(raw, MAX_INT_DIGITS) else None
        return json.loads(raw, parse_int=parse_int, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnreadableFile(f"it is not valid JSON ({e})") from None
    except (RecursionError, ValueError) as e:  # belt and braces behind the checks
        raise UnreadableFile(str(e)) from None


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file, read without blocking and only when small enough.

    Raises:
      FileNotFoundError: there is no such file.
      UnreadableFile: it is not a regular file, or it is larger than `max_bytes`.
      OSError: it cannot be opened (permissions, ...).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:
        raise UnreadableFile("it is a directory, not a regular file") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile("it is not a regular file")
        if info.st_size > max_bytes:
            raise UnreadableFile(f"it is {info.st_size} bytes (at most {max_bytes})")
        chunks, total = [], 0
        while True:  # the file may grow while we read: never past the limit
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise UnreadableFile(f"it is larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The JSON document in a local file, read and parsed with this module's limits.

    Raises:
      FileNotFoundError: there is no such file.
      UnreadableFile: see `read_bytes` and `loads`.
      OSError: it cannot be opened.
    """
    return loads(read_bytes(path, max_bytes=max_bytes), max_bytes=max_bytes)


def read_json_url(location: str, *, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """`read_json` for a path or any URL fsspec understands."""
    if "://" not in location or location.startswith("file://"):
        return read_json(location.removeprefix("file://"), max_bytes=max_bytes)
    import fsspec

    fs, path = fsspec.core.url_to_fs(location)
    size = fs.size(path)
    if size is not None and size > max_bytes:
        raise UnreadableFile(f"it is {size} bytes (at most {max_bytes})")
    with fs.open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    return loads(data, max_bytes=max_bytes)


# --- writing ----------------------------------------------------------------------------

_HOST = socket.gethostname().replace(".", "_")[:32] or "host"


def temp_name(name: str) -> str:
    """An unpredictable temporary name next to `name`, which says which host and
    process wrote it (so that one whose writer died can be removed early)."""
    return f".{name}.{_HOST}.{os.getpid()}.{secrets.token_hex(8)}{TEMP_SUFFIX}"


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def writer_is_dead(name: str) -> bool:
    """True when the temporary file `name` was written on this host by a process that
    no longer runs: nobody will ever rename it, so it can go at once."""
    parts = name[: -len(TEMP_SUFFIX)].split(".")
    if len(parts) < 4 or parts[-3] != _HOST or not parts[-2].isdigit():
        return False
    pid = int(parts[-2])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


def _create_temp(directory: str, name: str) -> tuple[str, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(8):
        temp = os.path.join(directory, temp_name(name))
        try:
            return temp, os.open(temp, flags | getattr(os, "O_BINARY", 0), FILE_MODE)
        except FileExistsError:
            continue  # something sits at that name (a planted link?): pick another
    raise FileExistsError(errno.EEXIST, "no free temporary name", os.path.join(directory, name))


def write_atomic(
    path: str | os.PathLike[str], data: bytes, *, fsync: bool = True, exclusive: bool = False
) -> bool:
    """Writes `data` to `path` atomically: readers see the old file or the new one.

    Args:
      path: the file to write; its directory is created when missing.
      data: the bytes.
      fsync: flush to the disk before the file becomes visible (a machine crash cannot
        then leave an empty file behind the rename).
      exclusive: publish only when no file is at `path` yet (create-exclusive, so that
        processes racing on the same key agree on the first one's file).

    Returns:
      True when the file was written; False when `exclusive` and a file was already
      there (it is left as it was).
    """
    target = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(target))
    for attempt in range(3):
        try:
            temp, fd = _create_temp(directory, name)
            break
        except FileNotFoundError:
            # A missing folder, or one that a concurrent delete just removed as it emptied.
            if attempt == 2:
                raise
            os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if exclusive:
            return _publish_exclusive(temp, target)
        os.replace(temp, target)
        return True
    finally:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass


def _publish_exclusive(temp: str, target: str) -> bool:
    try:
        os.link(temp, target)  # fails, atomically, when the target exists
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
    # A filesystem without hard links: the best we can do is check, then rename.
    if os.path.lexists(target):
        return False
    os.replace(temp, target)
    return True
