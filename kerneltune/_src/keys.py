"""Deterministic keys: abstract values, stable JSON, call-key seeds.

Every cache tier is keyed by `(device_fingerprint, "<op_id>@v<version>", call_key)`.
The call key must be the same in every process and on every machine for the same
abstract call, so it is built from `stable_json` (sorted keys, no memory addresses, no
file paths) and hashed.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import math
import types
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

# Configs as JSON live in configs.py; these names stay importable from here.
from kerneltune._src.configs import config_from_dict as config_from_dict
from kerneltune._src.configs import config_to_dict as config_to_dict
from kerneltune._src.configs import from_json as from_json
from kerneltune._src.configs import to_json as to_json

CALL_KEY_HEX_CHARS = 32


def is_array(x: Any) -> bool:
    """True for values that become dynamic (traced) inputs: JAX arrays and tracers,
    NumPy arrays and `jax.ShapeDtypeStruct` stand-ins."""
    return isinstance(x, (jax.Array, np.ndarray, jax.ShapeDtypeStruct, jax.core.Tracer))


def abstractify(tree: Any) -> Any:
    """Replaces every array leaf of `tree` by a `jax.ShapeDtypeStruct` (shape, dtype,
    and the sharding when the array is concrete and sharded); other leaves stay as
    they are (they are static values)."""

    def leaf(x: Any) -> Any:
        if not is_array(x):
            return x
        sharding = None
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            sharding = getattr(x, "sharding", None)
        if isinstance(x, jax.ShapeDtypeStruct):
            sharding = x.sharding
        return jax.ShapeDtypeStruct(tuple(x.shape), np.dtype(x.dtype), sharding=sharding)

    return jax.tree_util.tree_map(leaf, tree)


def _qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if qualname is None:
        qualname = type(obj).__qualname__
    return f"{module}.{qualname}" if module else str(qualname)


def _to_plain(obj: Any) -> Any:
    """Turns `obj` into JSON-able data, deterministically."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, enum.Enum):
        return {"__enum__": _qualified_name(type(obj)), "name": obj.name}
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        if math.isfinite(value):
            return value
        return {"__float__": repr(value)}
    if isinstance(obj, (np.dtype, type)) and _is_dtype_like(obj):
        return {"__dtype__": _dtype_name(obj)}
    if is_array(obj):
        return {"__array__": [int(d) for d in obj.shape], "dtype": str(np.dtype(obj.dtype))}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {"__dataclass__": type(obj).__qualname__, **fields}
    if isinstance(obj, Mapping):
        return {str(k): _to_plain(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, jax.sharding.PartitionSpec):
        return {"__pspec__": [_to_plain(p) for p in obj]}
    if isinstance(obj, jax.sharding.Mesh):
        return {
            "__mesh__": {str(k): int(v) for k, v in obj.shape.items()},
            "axis_names": [str(a) for a in obj.axis_names],
        }
    if isinstance(obj, jax.sharding.Sharding):
        return {"__sharding__": sharding_fingerprint_of(obj)}
    if isinstance(obj, (tuple, list)):
        return [_to_plain(x) for x in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((_to_plain(x) for x in obj), key=json.dumps)
    if isinstance(obj, functools.partial):
        return {
            "__partial__": _to_plain(obj.func),
            "args": _to_plain(obj.args),
            "kwargs": _to_plain(obj.keywords),
        }
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        # By qualified name only: never by file path or line, which differ between
        # checkouts and machines. Two lambdas in one scope share a key; give them names.
        return {"__callable__": _qualified_name(obj)}
    if isinstance(obj, type):
        return {"__type__": _qualified_name(obj)}
    if hasattr(obj, "__kerneltune_key__"):
        return {
            "__custom__": _qualified_name(type(obj)),
            "key": _to_plain(obj.__kerneltune_key__()),
        }
    raise TypeError(
        f"stable_json cannot encode a value of type {type(obj).__qualname__!r} "
        f"({_short_repr(obj)}): allowed are None, bool, int, float, str, enums, "
        "dtypes, arrays (by shape and dtype), dataclasses, mappings, sequences, "
        "meshes, partition specs, shardings, named functions, and objects with a "
        "__kerneltune_key__() method. Give the kernel a key_builder for other values."
    )


def _is_dtype_like(obj: Any) -> bool:
    if isinstance(obj, np.dtype):
        return True
    # NumPy scalar types and JAX's (jnp.float32 is a class with a .dtype).
    return isinstance(obj, type) and (issubclass(obj, np.generic) or hasattr(obj, "dtype"))


def _dtype_name(obj: Any) -> str:
    try:
        return str(np.dtype(obj))
    except TypeError:
        return str(np.dtype(obj.dtype))  # JAX scalar types such as jnp.bfloat16


def _short_repr(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


def stable_json(obj: Any) -> str:
    """Deterministic JSON for `obj`: sorted keys, compact separators, arrays by shape
    and dtype, functions by qualified name; the same text in every process.

    Example:
      >>> import kerneltune
      >>> kerneltune.stable_json({"b": 1, "a": (1.5, None)})
      '{"a":[1.5,null],"b":1}'
    """
    return json.dumps(_to_plain(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def hash_text(text: str, chars: int = CALL_KEY_HEX_CHARS) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:chars]


def sharding_fingerprint_of(sharding: Any) -> str:
    if sharding is None:
        return "none"
    if isinstance(sharding, jax.sharding.NamedSharding):
        mesh = sharding.mesh
        axes = ",".join(f"{name}={size}" for name, size in mesh.shape.items())
        return f"named[{axes}]{tuple(sharding.spec)!s}"
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return "single"
    num = len(getattr(sharding, "device_set", ())) or 1
    return f"{type(sharding).__name__}[{num}]"


def sharding_fingerprint(x: Any) -> str:
    """A short, stable description of how `x` is sharded (mesh axes and partition
    spec for a `NamedSharding`; "single" for one device; "none" when unknown, e.g. for
    tracers)."""
    if isinstance(x, jax.core.Tracer):
        return "none"
    return sharding_fingerprint_of(getattr(x, "sharding", None))


# --- call keys -------------------------------------------------------------------------


def describe_abstract(tree: Any) -> str:
    """A short human-readable signature: `f32[128,256], f32[256,64], causal=True`."""

    def one(x: Any) -> str:
        if is_array(x):
            dims = ",".join(str(d) for d in x.shape)
            return f"{_dtype_short(x.dtype)}[{dims}]"
        return _short_repr(x)

    if isinstance(tree, tuple) and len(tree) == 2 and isinstance(tree[1], Mapping):
        args, kwargs = tree
        parts = [_describe_leaves(a, one) for a in args]
        parts += [f"{k}={_describe_leaves(v, one)}" for k, v in sorted(kwargs.items())]
        return ", ".join(parts)
    return _describe_leaves(tree, one)


def _describe_leaves(tree: Any, one: Any) -> str:
    if not isinstance(tree, (list, tuple, dict)):
        return str(one(tree))
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: x is None)
    return "(" + ", ".join(one(x) for x in leaves) + ")"


def _dtype_short(dtype: Any) -> str:
    name = str(np.dtype(dtype)) if not hasattr(dtype, "name") else dtype.name
    return {
        "float32": "f32",
        "float64": "f64",
        "float16": "f16",
        "bfloat16": "bf16",
        "int32": "i32",
        "int64": "i64",
        "int8": "i8",
        "uint8": "u8",
        "bool": "bool",
    }.get(name, name)


def seed_of(call_key: str) -> int:
    """A 32-bit seed derived from a call key: its first 8 hex digits for the default
    keys, a hash of it for keys a custom `key_builder` made (which need not be hex)."""
    head = call_key[:8]
    if len(head) == 8 and all(c in "0123456789abcdefABCDEF" for c in head):
        return int(head, 16)
    return int(hash_text(call_key, 8), 16)
