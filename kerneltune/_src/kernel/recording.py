"""Recorded kernel calls: a registry of abstract invocations (manifests: manifest.py).

A record is what offline tuning needs to tune one call again later: the kernel (or how
to rebuild it), the op id with version, the call key, and the call's arguments with
every array replaced by a `jax.ShapeDtypeStruct` (shape, dtype, sharding). It never
holds a live device array or a tracer, so recording under `jit` keeps nothing alive.

The registry is `{device: {op_id_v: {call_key: Record}}}`, guarded by a lock; a key is
recorded once. A manifest is the registry as JSON: kernels are referenced by an
importable `"module:qualname"` plus their constructor's keyword arguments, so another
process (or machine) can rebuild them and tune (`kerneltune tune MANIFEST`). A manifest
is data: the names in it are looked up among the kernel classes defined in the reading
process (kernels register when their class is defined) and in modules it has already
imported and trusts; nothing named in a file is imported or called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax

from kerneltune._src.core import call_shapes, devices, keys, options, scope
from kerneltune._src.kernel.base import Invocation, Kernel, find_kernel_class, registered_kernels

logger = logging.getLogger("kerneltune")

Invocations = dict[str, dict[str, "Record"]]  # {op_id_v: {call_key: record}}


# --- kernel references ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelRef:
    """How another process rebuilds a kernel: `target` names a `Kernel` subclass as
    `"module:qualname"` (found among the classes defined in that process, never
    imported), called with `init` as keyword arguments."""

    target: str
    init: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def build(self) -> Kernel[Any, Any]:
        """Builds the kernel from the class registered as `target`, with `init` as
        keyword arguments. Nothing is imported: the class must already be defined in
        this process.

        Raises:
          LookupError: no such kernel class is defined in this process.
          TypeError: the class does not take these arguments.
        """
        cls = find_kernel_class(self.target)
        try:
            return cls(**dict(self.init))
        except TypeError as e:
            raise TypeError(f"{self.target}(**{dict(self.init)}) failed: {e}") from None


# Modules whose functions, enums and dataclasses a manifest may name (as static
# arguments): JAX's and NumPy's, those of registered kernels, and those the user named
# (`kerneltune tune --import MODULE`). Only modules already imported are looked in.
_TRUSTED_ROOTS = ("jax", "jaxlib", "numpy", "ml_dtypes")
_trusted_modules: set[str] = set()
#: Python's scalar types, which static arguments name (`acc_type=float`); no other
#: builtin can be named.
_BUILTIN_TYPES: dict[str, type] = {t.__name__: t for t in (bool, int, float, complex, str)}


def trust_module(name: str) -> None:
    """Lets manifests name values of module `name` (which the user imported)."""
    _trusted_modules.add(name)


def _trusted(module: str) -> bool:
    if module.split(".", 1)[0] in _TRUSTED_ROOTS or module in _trusted_modules:
        return True
    return any(c.__module__ == module for c in registered_kernels().values())


def lookup(target: str) -> Any:
    """The object named `"module:qualname"` in an already imported, trusted module
    (see `trust_module`). Nothing is imported and nothing is called.

    Raises:
      LookupError: the module is not imported or not trusted, or has no such name.
    """
    module_name, sep, qualname = target.partition(":")
    if not sep or not module_name or not qualname:
        raise LookupError(f"expected 'module:qualname', got {target!r}.")
    if module_name == "builtins" and qualname in _BUILTIN_TYPES:
        return _BUILTIN_TYPES[qualname]  # a static argument such as `dtype=float`
    module = sys.modules.get(module_name)
    if module is None or not _trusted(module_name):
        raise LookupError(
            f"{target!r} names a module that is not imported or not trusted; values in a "
            "manifest may come only from JAX, NumPy, the modules of registered kernels, "
            f"and modules imported on the command line (--import {module_name})."
        )
    obj: Any = module
    for part in qualname.split("."):
        # The instance dictionary only: no properties, no module __getattr__ run.
        space = vars(obj) if hasattr(obj, "__dict__") else {}
        if part.startswith("__") or part not in space:
            raise LookupError(f"module {module_name!r} has no attribute {qualname!r}.")
        obj = space[part]
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
      method, mesh, in_specs, out_specs, batch_axes, differentiated: as in the
        `Invocation` (`keys.KEY_FIELDS`: its key covers them).
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
    differentiated: bool | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.op_id_v, self.call_key)

    @functools.cached_property
    def shape(self) -> call_shapes.CallShape | None:
        """The call's sizes and size-free family, as `Invocation.shape`."""
        payload = keys.key_payload(tuple(self.args), dict(self.kwargs), **keys.key_fields(self))
        return call_shapes.call_shape(payload)

    def get_kernel(self) -> Kernel[Any, Any]:
        """The kernel: the recorded instance, else rebuilt from `ref`.

        Raises:
          LookupError, TypeError: it cannot be rebuilt (its class is not defined in
            this process, or does not take the recorded arguments).
          ValueError: the rebuilt kernel has another op id or version (its code changed
            since the call was recorded: its configs must be tuned anew).
        """
        if self.kernel is not None:
            return self.kernel
        if self.ref is None:
            raise LookupError(
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
        args = tuple(self.args)
        # A manifest keeps a named tuple of arrays as a plain tuple; a kernel whose
        # arguments hold one types them again (`AttentionVariants.args_from_record`).
        retype = getattr(kernel, "args_from_record", None)
        return Invocation(
            op_id=kernel.op_id,
            args=args if retype is None else tuple(retype(args)),
            kwargs=dict(self.kwargs),
            stamp=False,
            version=str(kernel.version),
            key_builder=FixedKey(self.call_key),
            **keys.key_fields(self),
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
        shardings=shardings,
        **keys.key_fields(inv),
    )


# --- the registry -------------------------------------------------------------------------

_registry: dict[str, dict[str, dict[str, Record]]] = {}
_lock = threading.Lock()


def record_invocation(kernel: Kernel[Any, Any], inv: Invocation[Any, Any]) -> Record:
    """Records a call for offline tuning (the executor calls it for every call while
    `KERNELTUNE_RECORD=1`, or inside `record_calls()`). A key already recorded keeps
    its first record. Returns the record."""
    if not isinstance(kernel, Kernel) or not isinstance(inv, Invocation):
        # Checked here: otherwise "'int' object has no attribute 'device_fingerprint'".
        raise TypeError(
            "record_invocation(kernel, inv) takes a kerneltune.Kernel and the Invocation "
            f"of one of its calls (`executor.invocation(kernel, *args)`), got "
            f"{type(kernel).__name__} and {type(inv).__name__}."
        )
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
