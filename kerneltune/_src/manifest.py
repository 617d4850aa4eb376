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

import dataclasses
import enum
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from kerneltune._src import files, keys
from kerneltune._src.recording import (
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
    from kerneltune._src.cache_entry import runtime_versions

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
    )


# --- the JSON codec of abstract values ------------------------------------------------------
#
# Plain JSON values stand for themselves; everything else is an object with one tag key.
# Dicts are tagged too, so that a user's dict can never be mistaken for a tagged value.


_MESH_TYPES = tuple(
    t for t in (getattr(jax.sharding, n, None) for n in ("Mesh", "AbstractMesh")) if t is not None
)


def encode(value: Any) -> Any:
    """Abstract arguments and static values as JSON data (see `decode`).

    Raises:
      TypeError: a value JSON cannot hold (give the kernel JSON-able static values).
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return {"__enum__": _name_of(type(value)), "name": value.name}
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return number if math.isfinite(number) else {"__float__": repr(number)}
    if isinstance(value, np.bool_):
        return bool(value)
    dtype = _as_dtype(value)
    if dtype is not None:
        return {"__dtype__": dtype.name}
    if keys.is_array(value):
        return {
            "__array__": [int(d) for d in value.shape],
            "dtype": np.dtype(value.dtype).name,
            "weak_type": bool(getattr(value, "weak_type", False)),
        }
    if isinstance(value, jax.sharding.PartitionSpec):
        return {"__pspec__": [encode(p) for p in value]}
    if isinstance(value, _MESH_TYPES):
        return {
            "__mesh__": [str(n) for n in value.axis_names],
            "sizes": [int(s) for s in value.shape.values()],
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init
        }
        return {"__dataclass__": _name_of(type(value)), "fields": fields}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"only string keys can be written, got {sorted(map(repr, value))}")
        return {"__dict__": {k: encode(v) for k, v in value.items()}}
    if callable(value) and hasattr(value, "__qualname__"):
        # Functions, classes and jitted functions, by name, if the name leads back here
        # (from a module that a reader trusts: see `recording.lookup`).
        name = _name_of(value)
        try:
            same = lookup(name) is value
        except LookupError:
            same = False
        if not same:
            raise TypeError(f"{value!r:.60} cannot be imported by name by another process")
        return {"__ref__": name}
    raise TypeError(
        f"cannot write a {type(value).__qualname__} ({value!r:.60}) to a manifest; static "
        "arguments must be JSON-like values, dtypes, enums, dataclasses or named functions."
    )


def decode(data: Any) -> Any:
    """The inverse of `encode`; arrays come back as `jax.ShapeDtypeStruct`s, meshes as
    `jax.sharding.AbstractMesh`es."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict) or len(data) == 0:
        raise TypeError(f"unexpected value {data!r:.60} in a manifest")
    if "__tuple__" in data:
        return tuple(decode(v) for v in data["__tuple__"])
    if "__dict__" in data:
        return {str(k): decode(v) for k, v in data["__dict__"].items()}
    if "__array__" in data:
        return jax.ShapeDtypeStruct(
            tuple(int(d) for d in data["__array__"]),
            np.dtype(data["dtype"]),
            weak_type=bool(data.get("weak_type", False)),
        )
    if "__dtype__" in data:
        return np.dtype(data["__dtype__"])
    if "__float__" in data:
        return float(data["__float__"])
    if "__pspec__" in data:
        return jax.sharding.PartitionSpec(*(_spec_entry(decode(p)) for p in data["__pspec__"]))
    if "__mesh__" in data:
        return jax.sharding.AbstractMesh(
            tuple(int(s) for s in data["sizes"]), tuple(data["__mesh__"])
        )
    if "__enum__" in data:
        cls = lookup(str(data["__enum__"]))
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise TypeError(f"{data['__enum__']} is not an enum")
        return cls[str(data["name"])]
    if "__dataclass__" in data:
        cls = lookup(str(data["__dataclass__"]))
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"{data['__dataclass__']} is not a dataclass")
        return cls(**{str(k): decode(v) for k, v in dict(data["fields"]).items()})
    if "__ref__" in data:
        return lookup(str(data["__ref__"]))
    raise TypeError(f"unknown tagged value {sorted(data)} in a manifest")


def _optional_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"expected a string or null, got {value!r:.60}")
    return value


def _as_dtype(value: Any) -> np.dtype[Any] | None:
    if isinstance(value, np.dtype):
        return value
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value)
    dtype = getattr(value, "dtype", None) if isinstance(value, type) else None
    if isinstance(dtype, np.dtype):
        return dtype  # JAX's scalar types, e.g. jnp.bfloat16
    return None


def _spec_entry(entry: Any) -> Any:
    return tuple(entry) if isinstance(entry, list) else entry


def _name_of(obj: Any) -> str:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname or not qualname:
        raise TypeError(f"{obj!r:.60} cannot be imported by name by another process")
    return f"{module}:{qualname}"
