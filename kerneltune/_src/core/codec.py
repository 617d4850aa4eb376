"""The one tagged-JSON codec: static values and abstract arguments as JSON data.

Call keys hash it (`keys.stable_json`) and manifests store it (`manifest.py`), so a value
is spelled the same way in both. Plain JSON values stand for themselves; everything
else is an object with one tag key (`__tuple__`, `__dict__`, `__array__`, `__dtype__`,
`__enum__`, `__dataclass__`, `__ref__`, `__mesh__`, `__pspec__`, `__float__`). Dicts are
tagged too, so that a user's dict is never mistaken for a tagged value. Names are
`"module:qualname"`.

`encode(value, for_key=True)` accepts more than a manifest can hold (sets, partials,
shardings, lambdas, objects with `__kerneltune_key__`): a key only needs to be the same
in every process, not to be turned back into the value. `decode` never imports: names
are resolved by the caller's `lookup`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from kerneltune._src.core import jax_compat

_MESH_TYPES = tuple(
    t for t in (getattr(jax.sharding, n, None) for n in ("Mesh", "AbstractMesh")) if t is not None
)


def is_array(x: Any) -> bool:
    """True for values that become dynamic (traced) inputs: JAX arrays and tracers,
    NumPy arrays and `jax.ShapeDtypeStruct` stand-ins."""
    return isinstance(x, (jax.Array, np.ndarray, jax.ShapeDtypeStruct, jax.core.Tracer))


def name_of(obj: Any) -> str:
    """`"module:qualname"` of a function, class or enum type."""
    module = getattr(obj, "__module__", None) or ""
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if qualname is None:
        qualname = type(obj).__qualname__
    return f"{module}:{qualname}"


def as_dtype(value: Any) -> np.dtype[Any] | None:
    """The dtype `value` stands for (a dtype, a NumPy or JAX scalar type), else None."""
    if isinstance(value, np.dtype):
        return value
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value)
    dtype = getattr(value, "dtype", None) if isinstance(value, type) else None
    return dtype if isinstance(dtype, np.dtype) else None  # e.g. jnp.bfloat16


def array_dtype(x: Any) -> Any:
    """The dtype of an array (or tracer, or stand-in): a NumPy dtype, or JAX's own for
    typed PRNG keys (`jax.random.key`), which NumPy cannot read."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
        return x.dtype
    return np.dtype(x.dtype)


def _dtype_name(dtype: Any) -> str:
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype)  # `key<fry>`


#: The typed PRNG key implementations, by their dtype's name (`key<fry>`), so that a
#: stored key dtype is rebuilt without naming anything the file chose.
_KEY_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


@functools.cache
def _key_dtypes() -> dict[str, tuple[str, Any]]:
    """Each typed PRNG key dtype by its name (`key<fry>`): its implementation and the
    dtype, read once (an abstract key of each implementation)."""
    out = {}
    for impl in _KEY_IMPLS:
        dtype = jax.eval_shape(lambda impl=impl: jax.random.key(0, impl=impl)).dtype
        out[str(dtype)] = (impl, dtype)
    return out


def key_impl(name: str) -> str:
    """The implementation (`jax.random.key(seed, impl=...)`) of the typed PRNG key
    dtype named `name` (`key<fry>`, `key<rbg>`, `key<urbg>`).

    Raises:
      TypeError: no key implementation has that dtype.
    """
    if name not in _key_dtypes():
        raise TypeError(f"unknown PRNG key dtype {name!r}; known: {list(_KEY_IMPLS)}")
    return _key_dtypes()[name][0]


def key_dtype(name: str) -> Any:
    """The typed PRNG key dtype named `name` (see `key_impl`)."""
    key_impl(name)  # raises for an unknown name
    return _key_dtypes()[name][1]


def sharding_fingerprint_of(sharding: Any) -> str:
    """A short, stable description of a sharding: mesh axes and partition spec for a
    `NamedSharding`, "single" for one device, "none" for None."""
    if sharding is None:
        return "none"
    if isinstance(sharding, jax.sharding.NamedSharding):
        axes = ",".join(f"{name}={size}" for name, size in sharding.mesh.shape.items())
        return f"named[{axes}]{tuple(sharding.spec)!s}"
    if jax_compat.is_single_device_sharding(sharding):
        return "single"
    num = len(getattr(sharding, "device_set", ())) or 1
    return f"{type(sharding).__name__}[{num}]"


def _named(obj: Any, check_ref: Callable[[str, Any], bool] | None) -> str:
    name = name_of(obj)
    if check_ref is not None and not check_ref(name, obj):
        raise TypeError(f"{obj!r:.60} cannot be found by name by another process")
    return name


def _dim(d: Any) -> Any:
    # Symbolic dimensions (jax.export) have no int value; their text is stable.
    return int(d) if isinstance(d, (int, np.integer)) else str(d)


def encode(
    value: Any,
    *,
    for_key: bool = False,
    check_ref: Callable[[str, Any], bool] | None = None,
) -> Any:
    """`value` as JSON data (see the module docstring).

    Args:
      value: the value.
      for_key: accept values that are hashed but cannot be decoded (see above).
      check_ref: for manifests: `check_ref(name, obj)` says whether another process
        finds `obj` by `name`; a function it rejects cannot be written.

    Raises:
      TypeError: a value the codec cannot hold.
    """

    def enc(v: Any) -> Any:
        return encode(v, for_key=for_key, check_ref=check_ref)

    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, enum.Enum):
        return {"__enum__": _named(type(value), check_ref), "name": value.name}
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return number if math.isfinite(number) else {"__float__": repr(number)}
    dtype = as_dtype(value)
    if dtype is not None:
        return {"__dtype__": dtype.name}
    if is_array(value):
        doc: dict[str, Any] = {
            "__array__": [_dim(d) for d in value.shape],
            "dtype": _dtype_name(array_dtype(value)),
        }
        if getattr(value, "weak_type", False):
            doc["weak_type"] = True
        return doc
    if isinstance(value, jax.sharding.PartitionSpec):
        return {"__pspec__": [enc(p) for p in value]}
    if isinstance(value, _MESH_TYPES):
        return {
            "__mesh__": [str(n) for n in value.axis_names],
            "sizes": [int(s) for s in value.shape.values()],
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: enc(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return {"__dataclass__": _named(type(value), check_ref), "fields": fields}
    if isinstance(value, tuple):
        return {"__tuple__": [enc(v) for v in value]}
    if isinstance(value, list):
        return [enc(v) for v in value]
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {"__dict__": {str(k): enc(value[k]) for k in sorted(value, key=str)}}
        if not for_key:
            raise TypeError(f"only string keys can be written, got {sorted(map(repr, value))}")
        # Other keys by value, so that {1: x} and {"1": x} are told apart.
        items = [[enc(k), enc(v)] for k, v in value.items()]
        return {"__items__": sorted(items, key=lambda kv: json.dumps(kv, sort_keys=True))}
    if for_key:
        extra = _key_only(value, enc)
        if extra is not None:
            return extra
    if callable(value) and not hasattr(value, "__qualname__"):
        # A jitted function that lost its name (a deep copy of `jax.nn.silu`): by the
        # name of the function inside it, as the jitted function itself is keyed.
        value = jax_compat.function_inside_jit(value) or value
    if callable(value) and hasattr(value, "__qualname__"):
        # Functions, classes, jitted and custom-gradient functions, by name only (never
        # by file path or line, which differ between machines).
        return {"__ref__": _named(value, check_ref)}
    if for_key and callable(value) and not isinstance(value, type):
        # A callable object (a `jnp.ufunc`, an instance with `__call__`): by its type, its
        # name where it has one, and its public attributes (which must be encodable).
        name = getattr(value, "__name__", None)
        described: dict[str, Any] = {"__callable__": name_of(type(value))}
        if isinstance(name, str):
            described["name"] = name
        public = {k: v for k, v in getattr(value, "__dict__", {}).items() if k[:1] != "_"}
        if public:
            described["state"] = enc(public)
        return described
    if for_key:
        raise TypeError(
            f"stable_json cannot encode a value of type {type(value).__qualname__!r} "
            f"({value!r:.60}): allowed are None, bool, int, float, str, enums, dtypes, "
            "arrays (by shape and dtype), dataclasses, mappings, sequences, sets, meshes, "
            "partition specs, shardings, named functions, and objects with a "
            "__kerneltune_key__() method. Give the kernel a key_builder for other values."
        )
    raise TypeError(
        f"cannot write a {type(value).__qualname__} ({value!r:.60}) to a manifest; static "
        "arguments must be JSON-like values, dtypes, enums, dataclasses or named functions."
    )


def _key_only(value: Any, enc: Callable[[Any], Any]) -> Any:
    if isinstance(value, (set, frozenset)):
        return {"__set__": sorted((enc(x) for x in value), key=json.dumps)}
    if isinstance(value, functools.partial):
        return {
            "__partial__": enc(value.func),
            "args": enc(value.args),
            "kwargs": enc(dict(value.keywords)),
        }
    if isinstance(value, jax.sharding.Sharding):
        return {"__sharding__": sharding_fingerprint_of(value)}
    if hasattr(value, "__kerneltune_key__"):
        return {"__custom__": name_of(type(value)), "key": enc(value.__kerneltune_key__())}
    return None


def decode(data: Any, lookup: Callable[[str], Any]) -> Any:
    """The inverse of `encode`; arrays come back as `jax.ShapeDtypeStruct`s, meshes as
    `jax.sharding.AbstractMesh`es. Names go through `lookup` (which never imports).

    Raises:
      TypeError, ValueError, LookupError: malformed data or a name `lookup` refuses.
    """

    def dec(v: Any) -> Any:
        return decode(v, lookup)

    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [dec(v) for v in data]
    if not isinstance(data, dict) or len(data) == 0:
        raise TypeError(f"unexpected value {data!r:.60}")
    if "__tuple__" in data:
        return tuple(dec(v) for v in _list(data["__tuple__"]))
    if "__dict__" in data:
        return {str(k): dec(v) for k, v in dict(data["__dict__"]).items()}
    if "__array__" in data:
        name = str(data["dtype"])
        return jax.ShapeDtypeStruct(
            tuple(int(d) for d in _list(data["__array__"])),
            key_dtype(name) if name.startswith("key<") else np.dtype(name),
            weak_type=data.get("weak_type") is True,
        )
    if "__dtype__" in data:
        return np.dtype(str(data["__dtype__"]))
    if "__float__" in data:
        return float(str(data["__float__"]))
    if "__pspec__" in data:
        entries = [dec(p) for p in _list(data["__pspec__"])]
        return jax.sharding.PartitionSpec(
            *(tuple(e) if isinstance(e, list) else e for e in entries)
        )
    if "__mesh__" in data:
        sizes = tuple(int(s) for s in _list(data["sizes"]))
        return jax.sharding.AbstractMesh(sizes, tuple(str(n) for n in _list(data["__mesh__"])))
    if "__enum__" in data:
        cls = lookup(str(data["__enum__"]))
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise TypeError(f"{data['__enum__']} is not an enum")
        return cls[str(data["name"])]
    if "__dataclass__" in data:
        cls = lookup(str(data["__dataclass__"]))
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"{data['__dataclass__']} is not a dataclass")
        renamed = getattr(cls, "renamed_fields", {})  # a config stored before a rename
        fields = dict(data["fields"]).items()
        return cls(**{renamed.get(str(k), str(k)): dec(v) for k, v in fields})
    if "__ref__" in data:
        return lookup(str(data["__ref__"]))
    raise TypeError(f"unknown tagged value {sorted(data)}")


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r:.60}")
    return value
