"""The candidate journal of an isolated tuning worker (`kerneltune tune --isolate`).

A worker process writes, before each candidate's first run, which key and candidate it
is about to run and for how long that may take; its parent reads the file. When the
worker dies (a segfault, an illegal memory access poisoning the CUDA context) or
overruns the bound (a hang), the parent knows the culprit, records it, and starts a new
worker that skips it. Off by default: only a worker given `--journal` writes one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from kerneltune._src.core import files
from kerneltune._src.core.configs import config_to_dict

_lock = threading.Lock()
_path: str | None = None
_key: tuple[str, str] | None = None
#: {(op_id_v, call_key): {stable cfg json: why it is excluded}}
_excluded: dict[tuple[str, str], dict[str, str]] = {}


def configure(path: str, *, excluded: Mapping[str, Any]) -> None:
    """Turns the journal on in this process (`excluded` as written by `excluded_doc`)."""
    global _path
    _path = path
    _excluded.clear()
    for item in excluded.get("excluded", []):
        key = (str(item["op_id"]), str(item["call_key"]))
        _excluded.setdefault(key, {})[_cfg_text(item["cfg"])] = str(item["reason"])


def enabled() -> bool:
    return _path is not None


def tuning_key(op_id_v: str, call_key: str) -> None:
    """The key the next candidates belong to."""
    global _key
    _key = (op_id_v, call_key)


def excluded_reason(cfg: Any) -> str | None:
    """Why `cfg` of the current key must not run again, or None."""
    if _key is None or not _excluded.get(_key):
        return None
    return _excluded[_key].get(_cfg_text(cfg))


def running(cfg: Any, bound_s: float) -> None:
    """`cfg`'s first run starts now; the parent kills the worker after `bound_s`."""
    if _path is None or _key is None:
        return
    _write(
        {
            "op_id": _key[0],
            "call_key": _key[1],
            "cfg": _plain(cfg),
            "since": time.time(),
            "bound_s": bound_s,
        }
    )


def ran() -> None:
    """The first run is over."""
    if _path is None:
        return
    _write({})


def _write(doc: dict[str, Any]) -> None:
    assert _path is not None
    with _lock:  # the parent reads the last complete entry; no fsync: a crash of the
        # machine ends the tuning anyway
        files.write_atomic(_path, json.dumps(doc).encode(), fsync=False)


def _cfg_text(cfg: Any) -> str:
    plain = _plain(cfg)
    return json.dumps(plain, sort_keys=True, default=str)


def _plain(cfg: Any) -> Any:
    """A config's fields (any candidate the tuner is given: a config, a mapping, or
    any other value such as a name)."""
    if isinstance(cfg, Mapping):
        return dict(cfg)
    try:
        return config_to_dict(cfg)
    except TypeError:
        return repr(cfg)


# --- the parent's side -----------------------------------------------------------------


def read_running(path: str) -> dict[str, Any] | None:
    """The candidate a worker is running now (its journal entry), or None."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("cfg") is not None else None


def excluded_doc(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"excluded": items}
