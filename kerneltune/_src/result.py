"""`AutotuningResult`: a set of tuned configs that can be applied, saved and merged."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from kerneltune._src import keys
from kerneltune._src.cache import overlay_cache

SCHEMA = 1


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tuned call: its op (`"<op_id>@v<version>"`), call key and config.

    Attributes:
      timings: each candidate's `{"cfg": ..., "status": ..., "time_s": ...}` when known.
      signature: the call's shapes, readable.
    """

    op_id_v: str
    call_key: str
    cfg: Any
    timings: tuple[Mapping[str, Any], ...] = ()
    signature: str = ""
    cfg_type: str = ""


@dataclasses.dataclass(frozen=True)
class AutotuningResult:
    """Tuned configs for one device. `with result:` applies them (an overlay).

    Example:
      >>> import kerneltune
      >>> r = kerneltune.AutotuningResult("cpu|cpu", (kerneltune.Entry("op@v0", "k", {"b": 1}),))
      >>> len(r), r.as_overlay()
      (1, {('cpu|cpu', 'op@v0', 'k'): {'b': 1}})
      >>> with r:
      ...     pass
    """

    device: str
    entries: tuple[Entry, ...] = ()

    def as_overlay(self) -> dict[tuple[str, str, str], Any]:
        return {(self.device, e.op_id_v, e.call_key): e.cfg for e in self.entries}

    # Applying: the exit callbacks live outside the (frozen) instance, per thread, so
    # entering never mutates the result and the same result can be entered in nested
    # blocks or several threads.
    _active = threading.local()

    def __enter__(self) -> AutotuningResult:
        stack = self._active.__dict__.setdefault("stack", [])
        manager = overlay_cache(self.as_overlay())
        manager.__enter__()
        stack.append((id(self), manager))
        return self

    def __exit__(self, *exc: Any) -> None:
        stack = self._active.__dict__.get("stack", [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == id(self):
                _, manager = stack.pop(i)
                manager.__exit__(*exc)
                return
        raise RuntimeError("AutotuningResult.__exit__ without a matching __enter__.")

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def __or__(self, other: AutotuningResult) -> AutotuningResult:
        """Merges two results; on the same (op, key) the right-hand entry wins."""
        if not isinstance(other, AutotuningResult):
            return NotImplemented
        if other.device != self.device:
            raise ValueError(
                f"cannot merge results of different devices: {self.device!r} and {other.device!r}."
            )
        merged = {(e.op_id_v, e.call_key): e for e in self.entries}
        merged.update({(e.op_id_v, e.call_key): e for e in other.entries})
        return AutotuningResult(self.device, tuple(merged.values()))

    # Serialization: configs are stored as plain fields; `loads` rebuilds them as the
    # types in `cfg_types` (looked up by the stored type name), never by importing
    # anything named in the file.

    def dumps(self) -> str:
        return json.dumps(
            {
                "schema": SCHEMA,
                "device": self.device,
                "entries": [
                    {
                        "op_id_v": e.op_id_v,
                        "call_key": e.call_key,
                        "cfg": keys.config_to_dict(e.cfg),
                        "cfg_type": e.cfg_type or type(e.cfg).__qualname__,
                        "timings": [dict(t) for t in e.timings],
                        "signature": e.signature,
                    }
                    for e in self.entries
                ],
            },
            indent=1,
            sort_keys=True,
            default=_json_default,
        )

    @classmethod
    def loads(cls, text: str, cfg_types: Mapping[str, type] | None = None) -> AutotuningResult:
        """Parses `dumps` output. Configs become instances of `cfg_types[name]` (keyed
        by op id with version, op id, or config class name); others stay dicts."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not an AutotuningResult document of schema {SCHEMA}.")
        types = dict(cfg_types or {})
        entries = []
        for raw in data["entries"]:
            cfg: Any = raw["cfg"]
            op_id = raw["op_id_v"].rsplit("@v", 1)[0]
            cls_ = types.get(raw["op_id_v"]) or types.get(op_id) or types.get(raw.get("cfg_type", ""))
            if cls_ is not None:
                cfg = keys.config_from_dict(cfg, cls_)
            entries.append(
                Entry(
                    raw["op_id_v"], raw["call_key"], cfg,
                    timings=tuple(raw.get("timings", ())), signature=raw.get("signature", ""),
                    cfg_type=raw.get("cfg_type", ""),
                )
            )
        return cls(data["device"], tuple(entries))

    def save(self, path: str | os.PathLike[str]) -> None:
        tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(self.dumps())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], cfg_types: Mapping[str, type] | None = None) -> AutotuningResult:
        with open(path) as f:
            return cls.loads(f.read(), cfg_types)


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return keys.config_to_dict(value)
    return str(value)
