"""Configs as plain JSON data, and back, checked against the config type.

A stored config is data from a file that anyone with write access to a shared cache
could have written, so it is rebuilt only as the type the caller names (never a type
named in the file), and every field is checked against that type's annotations
before the class is called: ints, floats, strings, bools, `None` where the field is
Optional, `Literal` values, enums, tuples, lists, dicts and nested dataclasses. The
class's own validation (`__post_init__`) runs last. A value that fails any check raises
`InvalidConfig`, which callers turn into "skip this entry and retune".
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from kerneltune._src.core import files

T = TypeVar("T")


class InvalidConfig(TypeError):
    """Stored fields that do not make a valid instance of the config type."""


def _short_repr(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A config's fields as plain JSON data (nested dataclasses become dicts)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping):
        return {str(k): _plain(v) for k, v in cfg.items()}
    raise TypeError(
        f"cfg must be a dataclass instance or a mapping, got {type(cfg).__qualname__} "
        f"({_short_repr(cfg)})."
    )


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.dtype):
        return str(value)
    return value


def to_json(cfg: Any) -> str:
    """Serializes a config (a dataclass, possibly nested) to JSON.

    Example:
      >>> import kerneltune
      >>> kerneltune.to_json(kerneltune.FwdParams(q_blocksize=64, kv_blocksize=64))
      '{"backend":"pallas","kv_blocksize":64,"num_stages":null,"num_warps":null,"q_blocksize":64}'
    """
    return json.dumps(config_to_dict(cfg), sort_keys=True, separators=(",", ":"))


def from_json(s: str | bytes, cls: type[T]) -> T:
    """Parses JSON written by `to_json` into an instance of `cls` (never executes code:
    the type comes from the caller, never from the text; the text is read with the
    limits of `files.loads`)."""
    try:
        data = files.loads(s)
    except files.UnreadableFile as e:  # its message says what is wrong with "it"
        raise files.UnreadableFile(f"from_json(s, {cls.__name__}): s is unreadable: {e}") from None
    return config_from_dict(data, cls)


def with_current_names(cls: type, data: Mapping[str, Any]) -> Mapping[str, Any]:
    """`data` with the fields `cls` renamed since it was stored under their names now
    (`cls.renamed_fields`, `{old: new}`), so configs stored before a rename load."""
    renamed: Mapping[str, str] = getattr(cls, "renamed_fields", {})
    if not renamed or not any(k in renamed for k in data):
        return data
    return {renamed.get(k, k): v for k, v in data.items()}


def current_names(cfg: Any, cfg_type: type | None) -> Any:
    """A stored config (a field dict, as caches and tables hold it) under the field
    names `cfg_type` has now, as a new dict; anything else (a config instance, None)
    as it is. Where stored configs are compared with live ones (predictions, `explain`)
    a config stored before a rename then matches the config it is."""
    if cfg_type is None or not isinstance(cfg, Mapping):
        return cfg
    return dict(with_current_names(cfg_type, cfg))


def config_from_dict(data: Mapping[str, Any], cls: type[T]) -> T:
    """Builds `cls` from plain data, checking every field against its annotation and
    recursing into nested dataclass fields.

    Raises:
      InvalidConfig: `data` is not a mapping, has fields `cls` does not have, lacks a
        required field, holds a value of the wrong type, or `cls` rejects the values.
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        if cls is dict or cls is typing.Any:
            return dict(data)  # type: ignore[return-value]
        raise TypeError(f"cls must be a dataclass type, got {cls!r}.")
    name = cls.__qualname__
    if not isinstance(data, Mapping):
        raise InvalidConfig(f"expected a JSON object for {name}, got {type(data).__name__}.")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    data = with_current_names(cls, data)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise InvalidConfig(f"{name} has no field(s) {unknown}; its fields are {sorted(fields)}.")
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that cannot be resolved: check what we can
        hints = {}
    kwargs = {k: _check(v, hints.get(k), f"{name}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except Exception as e:  # the config's own validation, or a missing field
        raise InvalidConfig(f"{name}({_short_repr(kwargs)[1:-1]}) is rejected: {e}") from None


def _a(name: str) -> str:
    """`name` after its article: "an int", "a str"."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _wrong(value: Any, where: str, expected: str) -> InvalidConfig:
    return InvalidConfig(f"{where} must be {expected}, got {_short_repr(value)}")


def _check(value: Any, hint: Any, where: str) -> Any:
    """`value` as the type `hint` asks for; raises InvalidConfig when it is not one."""
    # `object` admits every value, None included, as `Any` does.
    if hint is None or hint is Any or hint is object or isinstance(hint, (str, typing.TypeVar)):
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _check(value, args[0], where)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise _wrong(value, where, f"one of {args}")
        problems = []
        for option in args:
            if option is type(None):
                continue
            try:
                return _check(value, option, where)
            except InvalidConfig as e:
                problems.append(str(e))
        raise InvalidConfig("; ".join(problems))
    if origin is typing.Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise _wrong(value, where, f"one of {list(args)}")
    if value is None:
        raise _wrong(value, where, f"{_a(getattr(hint, '__name__', str(hint)))}, not None")
    if origin is tuple or hint is tuple:
        return _check_tuple(value, args, where)
    if origin is list or hint is list:
        if not isinstance(value, list):
            raise _wrong(value, where, "a list")
        return [_check(v, args[0] if args else None, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _wrong(value, where, "an object with string keys")
        item = args[1] if len(args) == 2 else None
        return {k: _check(v, item, f"{where}[{k!r}]") for k, v in value.items()}
    if not isinstance(hint, type):
        return value  # a typing construct we do not check (Callable, NewType, ...)
    return _check_class(value, hint, where)


def _check_tuple(value: Any, args: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise _wrong(value, where, "a list (a tuple)")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if args == ((),):  # tuple[()]
        args = ()
    elif not args:
        return tuple(value)
    if len(args) != len(value):
        raise _wrong(value, where, f"{len(args)} items")
    return tuple(_check(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))


def _check_class(value: Any, hint: type, where: str) -> Any:
    if isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        if isinstance(value, float) and not math.isfinite(value):
            raise _wrong(value, where, "a finite number")
        return value
    if issubclass(hint, enum.Enum):
        try:
            member = hint(value)
        except (ValueError, TypeError):
            values = [m.value for m in hint]
            raise _wrong(value, where, f"one of {values} ({hint.__qualname__})") from None
        if type(member.value) is not type(value):  # True is not 1
            raise _wrong(value, where, f"one of {[m.value for m in hint]}")
        return member
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise _wrong(value, where, f"an object ({hint.__qualname__})")
        return config_from_dict(value, hint)
    if hint is float:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        raise _wrong(value, where, "a number")
    if hint in (int, str, bool):
        raise _wrong(value, where, _a(hint.__name__))
    return value  # a class JSON cannot hold (a dtype, ...): the config's own check decides
