"""Manifests: recorded kernel calls saved as JSON, so another process or machine can
rebuild the kernels and tune the calls (`kerneltune tune MANIFEST`).

Kernels are referenced by `"module:qualname"` plus their constructor's keyword
arguments; every array is stored by shape, dtype and sharding. A manifest is data:
loading one imports nothing and calls nothing it names. The kernel classes are found
among those defined in the reading process (kernels register when their class is
defined; `kerneltune tune --import MODULE` imports what the user names), and static
values (enums, dataclasses, functions) only in modules already imported and trusted
(see `recording.lookup`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from kerneltune._src.caching.cache_entry import runtime_versions
from kerneltune._src.core import codec, files, jax_compat
from kerneltune._src.kernel.recording import (
    Invocations,
    KernelRef,
    Record,
    all_invocations,
    iter_records,
    kernel_ref,
    lookup,
)

logger = logging.getLogger("kerneltune")

MANIFEST_KIND = "kerneltune.manifest"
MANIFEST_SCHEMA = 1


# --- manifests ------------------------------------------------------------------------------


def save_manifest(
    path: str | os.PathLike[str],
    invocations: Any = None,
    *,
    on_unimportable: str = "error",
) -> int:
    """Writes recorded calls to a JSON manifest; returns how many.

    Args:
      path: the file to write (atomically).
      invocations: `{op_id_v: {call_key: record}}` (as `get_invocations` returns),
        `{device: {...}}`, or records; default: every recorded call of every device.
      on_unimportable: "error" (raise) or "skip" (leave out with a warning) for records
        whose kernel cannot be rebuilt by name or whose static arguments JSON cannot
        hold.

    Raises:
      ValueError: a record cannot be written and `on_unimportable="error"`.
    """
    if on_unimportable not in ("error", "skip"):
        raise ValueError(f"on_unimportable must be 'error' or 'skip', got {on_unimportable!r}.")
    records = iter_records(all_invocations() if invocations is None else invocations)
    docs, problems = [], []
    for record in records:
        try:
            docs.append(_record_document(record))
        except (TypeError, ValueError) as e:
            problems.append(f"{record.op_id_v} ({record.signature}): {e}")
    if problems and on_unimportable == "error":
        raise ValueError(
            f"{len(problems)} recorded call(s) cannot be written to a manifest (pass "
            "on_unimportable='skip' to leave them out): " + "; ".join(problems)
        )
    for problem in problems:
        logger.warning("Leaving a call out of the manifest: %s", problem)
    text = json.dumps(
        {
            "kind": MANIFEST_KIND,
            "schema": MANIFEST_SCHEMA,
            "created": time.time(),
            "versions": runtime_versions(),
            "records": docs,
        },
        indent=1,
        sort_keys=True,
        allow_nan=False,
    )
    files.write_atomic(path, text.encode())
    return len(docs)


def load_manifest(path: str | os.PathLike[str], *, dev: str | None = None) -> Invocations:
    """Reads a manifest as `{op_id_v: {call_key: record}}`. Records of every device are
    merged (a call key does not depend on the device), unless `dev` picks one. Kernels
    are rebuilt when the records are tuned (`Record.get_kernel`), not here.

    Raises:
      OSError: the file cannot be read.
      ValueError: it is not a kerneltune manifest, a record is malformed, or the file
        breaks the limits of `files.read_json` (size, depth, integer length, regular
        files only).
    """
    try:
        doc = files.read_json(path)
    except files.UnreadableFile as e:
        raise ValueError(f"{os.fspath(path)}: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != MANIFEST_KIND:
        raise ValueError(
            f"{os.fspath(path)} is not a kerneltune manifest (kind {MANIFEST_KIND!r})."
        )
    if doc.get("schema") != MANIFEST_SCHEMA:
        raise ValueError(
            f"{os.fspath(path)} has manifest schema {doc.get('schema')!r}; this version reads "
            f"{MANIFEST_SCHEMA}."
        )
    records = doc.get("records", [])
    if not isinstance(records, list):
        raise ValueError(f"{os.fspath(path)}: 'records' is not a list.")
    out: Invocations = {}
    for i, raw in enumerate(records):
        try:
            record = _record_from_document(raw)
        except (AttributeError, KeyError, LookupError, TypeError, ValueError) as e:
            raise ValueError(f"{os.fspath(path)}: record #{i} is malformed: {e}") from None
        if dev is None or record.device == dev:
            out.setdefault(record.op_id_v, {}).setdefault(record.call_key, record)
    return out


def _record_document(record: Record) -> dict[str, Any]:
    ref = (
        record.ref
        if record.ref is not None
        else (kernel_ref(record.kernel) if record.kernel is not None else None)
    )
    if ref is None:
        raise ValueError("the record has no kernel reference")
    return {
        "device": record.device,
        "op_id_v": record.op_id_v,
        "call_key": record.call_key,
        "signature": record.signature,
        "kernel": {"target": ref.target, "init": encode(dict(ref.init))},
        "args": encode(tuple(record.args)),
        "kwargs": encode(dict(record.kwargs)),
        "method": record.method,
        "mesh": encode(record.mesh),
        "in_specs": encode(record.in_specs),
        "out_specs": encode(record.out_specs),
        "batch_axes": encode(record.batch_axes),
        "shardings": list(record.shardings),
        "differentiated": record.differentiated,
    }


def _record_from_document(doc: Mapping[str, Any]) -> Record:
    if not isinstance(doc, dict) or not isinstance(doc.get("kernel"), dict):
        raise TypeError("a record must be an object with a 'kernel' object")
    kernel = doc["kernel"]
    if not isinstance(kernel.get("target"), str):
        raise TypeError("the kernel's 'target' is not a string")
    init = decode(kernel.get("init", {"__dict__": {}}))
    if not isinstance(init, dict):
        raise TypeError("the kernel's init is not an object")
    args = decode(doc["args"])
    kwargs = decode(doc["kwargs"])
    if not isinstance(args, tuple) or not isinstance(kwargs, dict):
        raise TypeError("args must be a tuple and kwargs an object")
    return Record(
        device=str(doc["device"]),
        op_id_v=str(doc["op_id_v"]),
        call_key=str(doc["call_key"]),
        args=args,
        kwargs=kwargs,
        ref=KernelRef(str(kernel["target"]), init),
        signature=str(doc.get("signature", "")),
        method=_optional_str(doc.get("method")),
        mesh=decode(doc.get("mesh")),
        in_specs=decode(doc.get("in_specs")),
        out_specs=decode(doc.get("out_specs")),
        batch_axes=decode(doc.get("batch_axes")),
        shardings=tuple(str(s) for s in doc.get("shardings", ())),
        differentiated=_optional_bool(doc.get("differentiated")),
    )


# --- the codec: one for keys and manifests (codec.py), with this file's name checks ------


def _optional_bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"'differentiated' must be true, false or null, got {value!r}")


def _optional_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"expected a string or null, got {value!r:.60}")
    return value


def _found_by_name(name: str, obj: Any) -> bool:
    try:
        found = lookup(name)
    except LookupError:
        return False
    # A jitted function is written by the name of the function inside it (a deep copy
    # of `jax.nn.silu` keeps no name of its own): the name finds the jitted one.
    return found is obj or jax_compat.function_inside_jit(found) is obj


def encode(value: Any) -> Any:
    """Abstract arguments and static values as JSON data (see `codec.encode`); named
    values must be found again by `recording.lookup` in a reading process.

    Raises:
      TypeError: a value a manifest cannot hold (give the kernel JSON-able static
        values, or values of trusted modules).
    """
    return codec.encode(value, check_ref=_found_by_name)


def decode(data: Any) -> Any:
    """The inverse of `encode`; names are looked up, never imported."""
    return codec.decode(data, lookup)
