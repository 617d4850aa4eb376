"""Deterministic keys: abstract values, stable JSON, call-key seeds.

Every cache tier is keyed by `(device_fingerprint, "<op_id>@v<version>", call_key)`.
The call key must be the same in every process and on every machine for the same
abstract call, so it is built from `stable_json` (sorted keys, no memory addresses, no
file paths) and hashed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from kerneltune._src.core import codec, jax_compat
from kerneltune._src.core.codec import is_array as is_array
from kerneltune._src.core.codec import sharding_fingerprint_of as sharding_fingerprint_of

# Configs as JSON live in configs.py; these names stay importable from here.
from kerneltune._src.core.configs import config_from_dict as config_from_dict
from kerneltune._src.core.configs import config_to_dict as config_to_dict
from kerneltune._src.core.configs import from_json as from_json
from kerneltune._src.core.configs import to_json as to_json

CALL_KEY_HEX_CHARS = 32


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
        return jax.ShapeDtypeStruct(tuple(x.shape), codec.array_dtype(x), sharding=sharding)

    return jax.tree_util.tree_map(leaf, tree)


#: The invocation fields, besides the abstract arguments, that a default call key covers.
KEY_FIELDS = ("batch_axes", "method", "mesh", "in_specs", "out_specs", "differentiated")


def key_fields(call: Any) -> dict[str, Any]:
    """The `KEY_FIELDS` of a call (an `Invocation`, or a recorded call), by name."""
    return {name: getattr(call, name) for name in KEY_FIELDS}


def key_payload(args: Any, kwargs: Any, **fields: Any) -> dict[str, Any]:
    """What a default call key is a hash of: the abstract arguments, and those of
    `KEY_FIELDS` that are not None."""
    payload: dict[str, Any] = {"args": args, "kwargs": kwargs}
    payload.update((k, v) for k, v in fields.items() if v is not None)
    return payload


def _to_plain(obj: Any) -> Any:
    """`obj` as JSON data for hashing: the codec of manifests, in its key mode."""
    return codec.encode(obj, for_key=True)


def _short_repr(obj: Any) -> str:
    if callable(obj) and not hasattr(obj, "__qualname__"):
        obj = jax_compat.function_inside_jit(obj) or obj  # a deep copy of a jitted one
    # Functions and types by name: their reprs hold memory addresses (or, for types,
    # the module path), which would make the signature differ between processes.
    qualname = getattr(obj, "__qualname__", None) if callable(obj) else None
    text = qualname if isinstance(qualname, str) else repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


def stable_json(obj: Any) -> str:
    """Deterministic JSON for `obj`: sorted keys, compact separators, arrays by shape
    and dtype, functions by qualified name; the same text in every process. Values are
    spelled as in manifests (`codec.py`): tuples and dicts are tagged.

    Example:
      >>> import kerneltune
      >>> kerneltune.stable_json({"b": 1, "a": (1.5, None)})
      '{"__dict__":{"a":{"__tuple__":[1.5,null]},"b":1}}'
    """
    return json.dumps(_to_plain(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def hash_text(text: str, chars: int = CALL_KEY_HEX_CHARS) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:chars]


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


#: The short dtype names signatures use (`f32[128,256]`).
SHORT_DTYPE_NAMES = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int32": "i32",
    "int64": "i64",
    "int8": "i8",
    "uint8": "u8",
    "bool": "bool",
}


def _dtype_short(dtype: Any) -> str:
    name = str(np.dtype(dtype)) if not hasattr(dtype, "name") else dtype.name
    return SHORT_DTYPE_NAMES.get(name, name)


def seed_of(call_key: str) -> int:
    """A 32-bit seed derived from a call key: its first 8 hex digits for the default
    keys, a hash of it for keys a custom `key_builder` made (which need not be hex)."""
    head = call_key[:8]
    if len(head) == 8 and all(c in "0123456789abcdefABCDEF" for c in head):
        return int(head, 16)
    return int(hash_text(call_key, 8), 16)
