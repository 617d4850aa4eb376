"""Recorded kernel calls: a registry of abstract invocations, and JSON manifests.

A record is what offline tuning needs to tune one call again later: the kernel (or how
to rebuild it), the op id with version, the call key, and the call's arguments with
every array replaced by a `jax.ShapeDtypeStruct` (shape, dtype, sharding). It never
holds a live device array or a tracer, so recording under `jit` keeps nothing alive.

The registry is `{device: {op_id_v: {call_key: Record}}}`, guarded by a lock; a key is
recorded once. A manifest is the registry as JSON: kernels are referenced by an
importable `"module:qualname"` plus their constructor's keyword arguments, so another
process (or machine) can rebuild them and tune (`kerneltune tune MANIFEST`). Loading a
manifest imports the modules it names, like any code reference: load only manifests
you trust.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from kerneltune._src import devices, keys, options, scope
from kerneltune._src.kernel import Invocation, Kernel

logger = logging.getLogger("kerneltune")

MANIFEST_KIND = "kerneltune.manifest"
MANIFEST_SCHEMA = 1

Invocations = dict[str, dict[str, "Record"]]  # {op_id_v: {call_key: record}}


# --- kernel references ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelRef:
    """How another process rebuilds a kernel: `target` names a `Kernel` subclass (called
    with `init` as keyword arguments), a factory function (likewise), or a module-level
    kernel instance, as `"module:qualname"`."""

    target: str
    init: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def build(self) -> Kernel[Any, Any]:
        """Imports the target and builds the kernel.

        Raises:
          ImportError: the module or the name cannot be found.
          TypeError: the target is not a kernel, a kernel class or a kernel factory.
        """
        obj = resolve(self.target)
        if isinstance(obj, Kernel):
            if self.init:
                raise TypeError(
                    f"{self.target} is a kernel instance; it takes no constructor "
                    f"arguments, but the manifest gives {dict(self.init)}."
                )
            return obj
        if not callable(obj):
            raise TypeError(f"{self.target} is a {type(obj).__qualname__}, not a kernel.")
        kernel = obj(**dict(self.init))
        if not isinstance(kernel, Kernel):
            raise TypeError(
                f"{self.target}(**{dict(self.init)}) returned a {type(kernel).__qualname__}, not a kernel."
            )
        return kernel


def resolve(target: str) -> Any:
    """The object named by `"module:qualname"`."""
    module_name, sep, qualname = target.partition(":")
    if not sep or not module_name or not qualname:
        raise ImportError(f"expected 'module:qualname', got {target!r}.")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"module {module_name!r} has no attribute {qualname!r}.") from None
    return obj


def kernel_ref(kernel: Kernel[Any, Any]) -> KernelRef:
    """The reference that rebuilds `kernel` in another process.

    A kernel whose constructor needs arguments defines `manifest_kwargs(self)`, returning
    them as a mapping of JSON-able values (numbers, strings, tuples, dtypes, dataclass
    configs, ...). Without it the kernel is rebuilt with no arguments, or with `op_id`
    when the instance's op id differs from its class's.

    Raises:
      ValueError: the kernel's class cannot be imported by name (defined in `__main__`
        or inside a function).
    """
    cls = type(kernel)
    target = f"{cls.__module__}:{cls.__qualname__}"
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise ValueError(
            f"kernel {kernel.op_id!r}: its class {target} cannot be imported by another "
            "process; define it at the top level of an importable module."
        )
    hook = getattr(kernel, "manifest_kwargs", None)
    if callable(hook):
        init = dict(hook())
    elif kernel.op_id != (cls.op_id or cls.__name__):
        init = {"op_id": kernel.op_id}
    else:
        init = {}
    return KernelRef(target, init)


# --- records --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Record:
    """One recorded call, abstract: arrays are `jax.ShapeDtypeStruct`s.

    Attributes:
      device: the fingerprint of the device it was recorded on.
      op_id_v: `"<op_id>@v<version>"`.
      call_key: the call key the executor computed (and stamped into the HLO).
      args, kwargs: the prepared arguments, arrays replaced by `ShapeDtypeStruct`s.
      kernel: the kernel instance, when recorded in this process.
      ref: how to rebuild the kernel elsewhere (None when it cannot be).
      signature: the readable shapes, e.g. `f32[128,256], causal=True`.
      method, mesh, in_specs, out_specs, batch_axes: as in the `Invocation`.
      shardings: the sharding fingerprint of every array leaf, in order.
    """

    device: str
    op_id_v: str
    call_key: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    kernel: Kernel[Any, Any] | None = None
    ref: KernelRef | None = None
    signature: str = ""
    method: str | None = None
    mesh: Any = None
    in_specs: Any = None
    out_specs: Any = None
    batch_axes: Any = None
    shardings: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.op_id_v, self.call_key)

    def get_kernel(self) -> Kernel[Any, Any]:
        """The kernel: the recorded instance, else rebuilt from `ref`.

        Raises:
          ImportError, TypeError: it cannot be rebuilt.
          ValueError: the rebuilt kernel has another op id or version (its code changed
            since the call was recorded: its configs must be tuned anew).
        """
        if self.kernel is not None:
            return self.kernel
        if self.ref is None:
            raise ImportError(
                f"{self.op_id_v}: the record has no kernel reference to rebuild it from."
            )
        kernel = self.ref.build()
        if kernel.op_id_v != self.op_id_v:
            raise ValueError(
                f"{self.ref.target} builds {kernel.op_id_v}, but the record is for "
                f"{self.op_id_v} (a new version of the kernel?); record the model again."
            )
        return kernel

    def invocation(self, kernel: Kernel[Any, Any] | None = None) -> Invocation[Any, Any]:
        """An `Invocation` for tuning this call: abstract arguments, and the recorded
        call key (so the tuned config lands exactly where the executor will look)."""
        kernel = self.get_kernel() if kernel is None else kernel
        return Invocation(
            op_id=kernel.op_id,
            args=tuple(self.args),
            kwargs=dict(self.kwargs),
            batch_axes=self.batch_axes,
            stamp=False,
            method=self.method,
            mesh=self.mesh,
            in_specs=self.in_specs,
            out_specs=self.out_specs,
            version=str(kernel.version),
            key_builder=FixedKey(self.call_key),
        )


@dataclasses.dataclass(frozen=True)
class FixedKey:
    """A key builder that returns a call key computed earlier."""

    call_key: str

    def __call__(self, inv: Invocation[Any, Any]) -> str:
        return self.call_key


def make_record(kernel: Kernel[Any, Any], inv: Invocation[Any, Any]) -> Record:
    """The abstract record of `inv` (tracers and arrays become `ShapeDtypeStruct`s)."""
    leaves = jax.tree_util.tree_leaves((tuple(inv.args), dict(inv.kwargs)))
    shardings = tuple(keys.sharding_fingerprint(x) for x in leaves if keys.is_array(x))
    try:
        ref: KernelRef | None = kernel_ref(kernel)
    except ValueError:
        ref = None
    return Record(
        device=inv.device_fingerprint,
        op_id_v=inv.op_id_v,
        call_key=inv.call_key,
        args=tuple(keys.abstractify(tuple(inv.args))),
        kwargs=dict(keys.abstractify(dict(inv.kwargs))),
        kernel=kernel,
        ref=ref,
        signature=inv.signature,
        method=inv.method,
        mesh=inv.mesh,
        in_specs=inv.in_specs,
        out_specs=inv.out_specs,
        batch_axes=inv.batch_axes,
        shardings=shardings,
    )


# --- the registry -------------------------------------------------------------------------

_registry: dict[str, dict[str, dict[str, Record]]] = {}
_lock = threading.Lock()


def record_invocation(kernel: Kernel[Any, Any], inv: Invocation[Any, Any]) -> Record:
    """Records a call for offline tuning (the executor calls it for every call while
    `KERNELTUNE_RECORD=1`, or inside `record_calls()`). A key already recorded keeps
    its first record. Returns the record."""
    dev, op_id_v, call_key = inv.device_fingerprint, inv.op_id_v, inv.call_key
    existing = _registry.get(dev, {}).get(op_id_v, {}).get(call_key)
    if existing is not None:
        return existing
    record = make_record(kernel, inv)
    with _lock:
        per_op = _registry.setdefault(dev, {}).setdefault(op_id_v, {})
        return per_op.setdefault(call_key, record)


def get_invocations(dev: str | None = None) -> Invocations:
    """The recorded calls of device `dev` (default: this process's device) as
    `{op_id_v: {call_key: record}}`: a snapshot, safe to iterate while recording goes on.
    """
    dev = devices.device_fingerprint() if dev is None else dev
    with _lock:
        return {op: dict(calls) for op, calls in _registry.get(dev, {}).items()}


def all_invocations() -> dict[str, Invocations]:
    """Every recorded call of every device: `{device: {op_id_v: {call_key: record}}}`."""
    with _lock:
        return {
            dev: {op: dict(calls) for op, calls in ops.items()} for dev, ops in _registry.items()
        }


def clear_invocations() -> None:
    """Forgets every recorded call."""
    with _lock:
        _registry.clear()


@contextlib.contextmanager
def record_calls() -> Iterator[None]:
    """Records every executor call made inside the block (context-local), like
    `KERNELTUNE_RECORD=1`. Functions jitted before the block are traced again inside it,
    so their calls are recorded too.

    Example:
      >>> import jax.numpy as jnp
      >>> with record_calls():
      ...     pass  # run the model once here
    """
    # The recording flag is part of the scope, which keys both the executor's eager
    # dispatch table and JAX's trace cache: calls that ran before the block reach the
    # executor's slow path again (where calls are recorded) inside it.
    with options.scoped(record=True), scope.with_recording():
        yield


def iter_records(invocations: Any) -> list[Record]:
    """The records of `{op_id_v: {call_key: record}}`, `{device: {...}}` or an iterable
    of records, sorted by (op_id_v, call_key), one per key."""
    found: dict[tuple[str, str], Record] = {}

    def visit(obj: Any) -> None:
        if isinstance(obj, Record):
            found.setdefault(obj.key, obj)
        elif isinstance(obj, Mapping):
            for value in obj.values():
                visit(value)
        elif isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
            for value in obj:
                visit(value)
        else:
            raise TypeError(
                f"expected records or mappings of records, got {type(obj).__qualname__}."
            )

    visit(invocations)
    return [found[k] for k in sorted(found)]


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
    target = os.fspath(path)
    tmp = f"{target}.tmp{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, target)
    return len(docs)


def load_manifest(path: str | os.PathLike[str], *, dev: str | None = None) -> Invocations:
    """Reads a manifest as `{op_id_v: {call_key: record}}`. Records of every device are
    merged (a call key does not depend on the device), unless `dev` picks one. Kernels
    are rebuilt when the records are tuned (`Record.get_kernel`), not here.

    Raises:
      OSError: the file cannot be read.
      ValueError: it is not a kerneltune manifest, or a record is malformed.
    """
    with open(os.fspath(path)) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{os.fspath(path)} is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != MANIFEST_KIND:
        raise ValueError(
            f"{os.fspath(path)} is not a kerneltune manifest (kind {MANIFEST_KIND!r})."
        )
    if doc.get("schema") != MANIFEST_SCHEMA:
        raise ValueError(
            f"{os.fspath(path)} has manifest schema {doc.get('schema')!r}; this version reads "
            f"{MANIFEST_SCHEMA}."
        )
    out: Invocations = {}
    for i, raw in enumerate(doc.get("records", ())):
        try:
            record = _record_from_document(raw)
        except (KeyError, TypeError, ValueError, ImportError) as e:
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
    kernel = doc["kernel"]
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
        method=doc.get("method"),
        mesh=decode(doc.get("mesh")),
        in_specs=decode(doc.get("in_specs")),
        out_specs=decode(doc.get("out_specs")),
        batch_axes=decode(doc.get("batch_axes")),
        shardings=tuple(doc.get("shardings", ())),
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
        # Functions, classes and jitted functions, by name, if the name leads back here.
        name = _name_of(value)
        try:
            same = resolve(name) is value
        except ImportError:
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
        return resolve(data["__enum__"])[data["name"]]
    if "__dataclass__" in data:
        cls = resolve(data["__dataclass__"])
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"{data['__dataclass__']} is not a dataclass")
        return cls(**{k: decode(v) for k, v in data["fields"].items()})
    if "__ref__" in data:
        return resolve(data["__ref__"])
    raise TypeError(f"unknown tagged value {sorted(data)} in a manifest")


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
