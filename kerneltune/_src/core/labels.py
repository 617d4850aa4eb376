"""Labels stamped into the HLO of every executor call, and reading them back.

A label is a frontend attribute (`jax.experimental.xla_metadata`), which survives
into `lowered.as_text()`, the HLO text and the compiled HLO with its characters intact
(named scopes alone lose `@` and `:`), plus a readable named scope for profiler traces.

Label text: `<prefix>:<op_id>@v<version>:<call_key>` (`KERNELTUNE_STAMP=hash`, the
default), with `:<config JSON>` appended under `KERNELTUNE_STAMP=json`. A custom
`key_builder` may return any string: in the label, its `%` and `:` are written `%25`
and `%3A` (default keys, hex digits, are written as they are).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax

from kerneltune._src.core import keys

logger = logging.getLogger("kerneltune")

ATTRIBUTE = "kerneltune_label"
_ATTR_RE = re.compile(ATTRIBUTE + r'\s*=\s*"((?:[^"\\]|\\.)*)"')
F = TypeVar("F", bound=Callable[..., Any])

_set_xla_metadata: Any
try:
    from jax.experimental.xla_metadata import set_xla_metadata as _set_xla_metadata
except ImportError:  # pragma: no cover - very old or very new JAX
    _set_xla_metadata = None


@dataclasses.dataclass(frozen=True)
class Label:
    """One parsed label."""

    prefix: str
    op_id_v: str
    call_key: str
    cfg_json: str | None = None

    @property
    def text(self) -> str:
        key = self.call_key.replace("%", "%25").replace(":", "%3A")
        base = f"{self.prefix}:{self.op_id_v}:{key}"
        return base if self.cfg_json is None else f"{base}:{self.cfg_json}"


_KEY_ESCAPES = re.compile(r"%(25|3A)")


def _unescape_key(text: str) -> str:
    return _KEY_ESCAPES.sub(lambda m: "%" if m.group(1) == "25" else ":", text)


def label_text(prefix: str, op_id_v: str, call_key: str, cfg: Any, mode: str) -> str:
    cfg_json = None
    if mode == "json":
        try:
            cfg_json = keys.to_json(cfg)
        except TypeError:
            cfg_json = None
    return Label(prefix, op_id_v, call_key, cfg_json).text


@contextlib.contextmanager
def stamped(text: str, scope_name: str) -> Iterator[None]:
    """Everything traced inside carries the label `text` and the named scope."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(jax.named_scope(scope_name))
        if _set_xla_metadata is not None:
            stack.enter_context(_set_xla_metadata(**{ATTRIBUTE: text}))
        yield


def label(name: str) -> Callable[[F], F]:
    """Decorator: labels everything `fn` traces with `name` (visible in the HLO and in
    profiler traces).

    Example:
      >>> import jax, jax.numpy as jnp, kerneltune
      >>> @kerneltune.label("my_block")
      ... def f(x):
      ...     return jnp.sin(x)
      >>> "my_block" in kerneltune.find_labels_in_lowered(jax.jit(f).lower(jnp.ones(2)))
      True
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"label(name) needs a non-empty string, got {name!r}.")

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with stamped(name, name):
                return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


def extract_labels_from_hlo_text(text: str) -> list[str]:
    """Every distinct label in an HLO, StableHLO or compiled-HLO text, in order of
    appearance.

    Example:
      >>> extract_labels_from_hlo_text('x = f32[] add(a, b), frontend_attributes={kerneltune_label="kt:op@v1:abc"}')
      ['kt:op@v1:abc']
    """
    if not isinstance(text, str):
        raise TypeError(
            "extract_labels_from_hlo_text(text) takes a module's text (a str: "
            "`jax.jit(f).lower(x).as_text()`, or `.compile().as_text()`), got "
            f"{type(text).__name__} ({text!r:.60})."
        )
    # HLO prints C-style escapes (a quote as \"); MLIR prints hex ones (\22).
    unescape = _unescape_hlo if "HloModule" in text[:2000] else _unescape_mlir
    seen: dict[str, None] = {}
    for match in _ATTR_RE.finditer(text):
        seen.setdefault(unescape(match.group(1)), None)
    return list(seen)


_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\"}


def _unescape_hlo(value: str) -> str:
    def one(m: re.Match[str]) -> str:
        body = m.group(1)
        if body[0] in "01234567":
            return chr(int(body, 8))
        return _C_ESCAPES.get(body, body)

    return _utf8(re.sub(r"\\([0-7]{3}|.)", one, value))


def _unescape_mlir(value: str) -> str:
    def one(m: re.Match[str]) -> str:
        body = m.group(1)
        if len(body) == 2:
            return chr(int(body, 16))
        return _C_ESCAPES.get(body, body)

    return _utf8(re.sub(r"\\([0-9a-fA-F]{2}|.)", one, value))


def _utf8(raw: str) -> str:
    # Non-ASCII characters are printed as their UTF-8 bytes, one escape per byte.
    try:
        return raw.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return raw


_LABEL_RE = re.compile(
    r"^(?P<prefix>[^:]+):(?P<op>[^@]+@v[^:]*):(?P<key>[^:]+)(?::(?P<cfg>.*))?$", re.S
)


def parse_label(text: str) -> Label | None:
    """Splits a kernel-call label into its parts; None for other labels (e.g. ones made
    by the `label` decorator).

    Example:
      >>> parse_label("kerneltune:matmul@v1:0123abcd").call_key
      '0123abcd'
      >>> parse_label("my_block") is None
      True
    """
    m = _LABEL_RE.match(text)
    if m is None:
        return None
    return Label(m.group("prefix"), m.group("op"), _unescape_key(m.group("key")), m.group("cfg"))


def lowered_texts(lowered: Any, *, compiled: bool = False) -> list[str]:
    """The texts of a `jax.jit(f).lower(...)` result where labels can be found: the
    StableHLO module and its HLO, plus the compiled HLO when `compiled` (which
    compiles). A `Compiled` object or a text is taken as it is."""
    if isinstance(lowered, str):
        return [lowered]
    if not hasattr(lowered, "compiler_ir"):
        if not callable(getattr(lowered, "as_text", None)):
            raise TypeError(
                "expected a lowered computation (jax.jit(f).lower(...)), its .compile(), "
                f"or an HLO text, got {type(lowered).__qualname__}."
            )
        return [lowered.as_text()]  # a Compiled object
    getters = [lambda: lowered.as_text(), lambda: lowered.compiler_ir("hlo").as_hlo_text()]
    if compiled:
        getters.append(lambda: lowered.compile().as_text())
    texts = []
    for get in getters:
        try:
            text = get()
        except Exception as e:  # dialects and APIs differ between versions.
            logger.debug("kerneltune: could not read a lowered text: %s", e)
            continue
        if text:
            texts.append(text)
    return texts


def find_labels_in_lowered(lowered: Any, *, compiled: bool = False) -> list[str]:
    """Every distinct label in a lowered computation (`jax.jit(f).lower(...)`), a
    compiled one (`.compile()`), or an HLO/StableHLO text.

    Args:
      lowered: the computation.
      compiled: also compile a lowered computation and read the compiled HLO.

    Raises:
      TypeError: `lowered` is none of these.
    """
    found: dict[str, None] = {}
    for text in lowered_texts(lowered, compiled=compiled):
        for item in extract_labels_from_hlo_text(text):
            found.setdefault(item, None)
    return list(found)


def kernel_labels_in_lowered(lowered: Any, *, compiled: bool = False) -> list[Label]:
    """The kernel-call labels (op, key) in a lowered computation, without duplicates."""
    out: dict[tuple[str, str], Label] = {}
    for text in find_labels_in_lowered(lowered, compiled=compiled):
        parsed = parse_label(text)
        if parsed is not None:
            out.setdefault((parsed.op_id_v, parsed.call_key), parsed)
    return list(out.values())
