"""`AutotuningResult`: a set of tuned configs that can be applied, saved and merged.

Its file format is the persistent cache's export format (one entry document per tuned
call, with every candidate's timings), so a result written by `kerneltune tune --out`
or `AutotuningResult.save` can be imported with `kerneltune cache import FILE`, merged
with `kerneltune cache merge FILE`, or shipped as a read-only cache layer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from kerneltune._src.caching.cache import overlay_cache
from kerneltune._src.caching.cache_entry import BadEntry, Entry, entry_from_document
from kerneltune._src.caching.storage import EXPORT_KIND
from kerneltune._src.core import files, keys

__all__ = ["AutotuningResult", "Entry"]


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
      >>> kerneltune.AutotuningResult.loads(r.dumps()) == r
      True
    """

    device: str
    entries: tuple[Entry, ...] = ()

    def __post_init__(self) -> None:
        # Any iterable of entries is taken; stored as a tuple, so that results compare
        # and hash by their entries whatever the caller built them from.
        object.__setattr__(self, "entries", tuple(self.entries))

    def as_overlay(self) -> dict[tuple[str, str, str], Any]:
        """`{(device, op_id_v, call_key): cfg}`, as `overlay_cache` takes it."""
        return {(self.device, e.op_id_v, e.call_key): e.cfg for e in self.entries}

    def get(self, op_id_v: str, call_key: str) -> Entry | None:
        """The entry of one call, or None."""
        return next(
            (e for e in self.entries if (e.op_id_v, e.call_key) == (op_id_v, call_key)), None
        )

    # Applying: the exit callbacks live outside the (frozen) instance, per thread, so
    # entering never mutates the result and the same result can be entered in nested
    # blocks or several threads.
    _active = threading.local()

    def __enter__(self) -> AutotuningResult:
        stack = self._active.__dict__.setdefault("stack", [])
        manager = overlay_cache(self.as_overlay())
        manager.__enter__()
        stack.append((self, manager))
        return self

    def __exit__(self, *exc: Any) -> None:
        stack = self._active.__dict__.get("stack", [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is self:
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

    # Serialization: the persistent cache's export format. Configs are stored as plain
    # fields; `loads` rebuilds them as the types in `cfg_types`, never by importing a
    # name found in the file. Plain-field configs still work in `with result:` (the
    # selection chain turns them into the kernel's config type).

    def dumps(self) -> str:
        """The result as JSON (a `kerneltune cache` export document)."""
        return json.dumps(
            {
                "kind": EXPORT_KIND,
                "schema": 1,
                "exported": time.time(),
                "device": self.device,
                "entries": [
                    dataclasses.replace(e, dev=self.device).to_document() for e in self.entries
                ],
            },
            indent=1,
            sort_keys=True,
            allow_nan=False,
        )

    @classmethod
    def loads(
        cls, text: str, cfg_types: Mapping[str, type] | None = None, *, device: str | None = None
    ) -> AutotuningResult:
        """Parses `dumps` output, or any `kerneltune cache export` file.

        Args:
          text: the JSON text.
          cfg_types: config classes, keyed by op id with version ("matmul@v1"), op id
            ("matmul") or config class name; matching configs are rebuilt as instances,
            the others stay dicts of fields.
          device: the device whose entries to take, when the document holds several.

        Raises:
          ValueError: not a result/export document, a malformed entry, or entries of
            several devices without `device`.
        """
        try:
            data = files.loads(text)
        except files.UnreadableFile as e:
            raise ValueError(f"not an AutotuningResult document: {e}") from None
        if (
            not isinstance(data, dict)
            or data.get("kind") != EXPORT_KIND
            or not isinstance(data.get("entries"), list)
        ):
            raise ValueError(
                f"not an AutotuningResult document (expected kind {EXPORT_KIND!r} with entries)."
            )
        try:
            raw = [entry_from_document(doc, f"entry #{i}") for i, doc in enumerate(data["entries"])]
        except BadEntry as e:
            raise ValueError(f"malformed AutotuningResult entry: {e}") from None
        devices = sorted(
            {r.dev for r in raw}
            | ({data["device"]} if isinstance(data.get("device"), str) else set())
        )
        if device is None:
            if len(devices) > 1:
                raise ValueError(
                    f"the document holds entries of several devices {devices}; pass device=."
                )
            device = devices[0] if devices else ""
        types = dict(cfg_types or {})
        entries = []
        for r in raw:
            if r.dev != device:
                continue
            short_type = r.cfg_type.rsplit(".", 1)[-1]
            op_id = r.op_id_v.rsplit("@v", 1)[0]
            cls_ = (
                types.get(r.op_id_v)
                or types.get(op_id)
                or types.get(r.cfg_type)
                or types.get(short_type)
            )
            if cls_ is not None:
                r = dataclasses.replace(r, cfg=keys.config_from_dict(r.cfg, cls_))
            entries.append(r)
        return cls(device, tuple(entries))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes `dumps()` to `path`, atomically."""
        files.write_atomic(path, self.dumps().encode())

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        cfg_types: Mapping[str, type] | None = None,
        *,
        device: str | None = None,
    ) -> AutotuningResult:
        """Reads a file written by `save` (or `kerneltune cache export`); see `loads`.

        Raises:
          OSError: the file cannot be read.
          ValueError: see `loads`; also a file that is not a regular file or breaks the
            size limit of `files.read_bytes`.
        """
        try:
            data = files.read_bytes(path)
        except files.UnreadableFile as e:
            raise ValueError(f"cannot read {os.fspath(path)}: {e}") from None
        return cls.loads(data.decode("utf-8", "replace"), cfg_types, device=device)
