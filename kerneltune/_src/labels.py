"""Labels stamped into the HLO of every executor call, and reading them back.

A label is a frontend attribute (`jax.experimental.xla_metadata`), which survives
into `lowered.as_text()`, the HLO text and the compiled HLO with its characters intact
(named scopes alone lose `@` and `:`), plus a readable named scope for profiler traces.

Label text: `<prefix>:<op_id>@v<version>:<call_key>` (`KERNELTUNE_STAMP=hash`, the
default), with `:<config JSON>` appended under `KERNELTUNE_STAMP=json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax

from kerneltune._src import keys

ATTRIBUTE = "kerneltune_label"
_ATTR_RE = re.compile(ATTRIBUTE + r'\s*=\s*"((?:[^"\\]|\\.)*)"')
F = TypeVar("F", bound=Callable[..., Any])

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
        base = f"{self.prefix}:{self.op_id_v}:{self.call_key}"
        return base if self.cfg_json is None else f"{base}:{self.cfg_json}"


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
    """Every distinct label in an HLO or StableHLO text, in order of appearance."""
    seen: dict[str, None] = {}
    for match in _ATTR_RE.finditer(text):
        seen.setdefault(_unescape(match.group(1)), None)
    return list(seen)


def _unescape(value: str) -> str:
    # MLIR writes a quote as \22 (two hex digits); HLO text as \".
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        return chr(int(code, 16)) if len(code) == 2 else code

    return re.sub(r"\\([0-9a-fA-F]{2}|.)", one, value)


def parse_label(text: str) -> Label | None:
    """Splits a kernel-call label into its parts; None for other labels (e.g. ones made
    by the `label` decorator)."""
    parts = text.split(":", 3)
    if len(parts) < 3 or "@v" not in parts[1]:
        return None
    return Label(parts[0], parts[1], parts[2], parts[3] if len(parts) == 4 else None)


def lowered_texts(lowered: Any) -> list[str]:
    """The texts of a `jax.jit(f).lower(...)` result where labels can be found."""
    texts = []
    for get in (
        lambda: lowered.as_text(),
        lambda: lowered.compiler_ir("hlo").as_hlo_text(),
    ):
        try:
            texts.append(get())
        except Exception:  # noqa: BLE001, PERF203 - dialects differ between versions.
            continue
    return texts


def find_labels_in_lowered(lowered: Any) -> list[str]:
    """Every distinct label in a lowered (or compiled) computation."""
    if hasattr(lowered, "as_text") and not hasattr(lowered, "compiler_ir"):
        texts = [lowered.as_text()]  # a Compiled object
    else:
        texts = lowered_texts(lowered)
    found: dict[str, None] = {}
    for text in texts:
        for item in extract_labels_from_hlo_text(text):
            found.setdefault(item, None)
    return list(found)


def kernel_labels_in_lowered(lowered: Any) -> list[Label]:
    """The kernel-call labels (op, key) in a lowered computation, without duplicates."""
    out: dict[tuple[str, str], Label] = {}
    for text in find_labels_in_lowered(lowered):
        parsed = parse_label(text)
        if parsed is not None:
            out.setdefault((parsed.op_id_v, parsed.call_key), parsed)
    return list(out.values())


def labels_to_configs(lowered: Any, selector: Any = None) -> dict[tuple[str, str], Any]:
    """`{(op_id_v, call_key): cfg}` for the kernel calls in `lowered` whose config the
    selector's caches (memory, then persistent) hold; the default executor's selector
    when `selector` is None. Calls with no cached config are left out."""
    from kerneltune._src.devices import device_fingerprint
    from kerneltune._src.executor import default_executor

    if selector is None:
        selector = default_executor().chooser
    dev = device_fingerprint()
    found: dict[tuple[str, str], Any] = {}
    for lab in kernel_labels_in_lowered(lowered):
        cfg = selector.cache.get(dev, lab.op_id_v, lab.call_key)
        if cfg is None and getattr(selector, "persistent", None) is not None:
            cfg = selector.persistent.get(dev, lab.op_id_v, lab.call_key)
        if cfg is not None:
            found[(lab.op_id_v, lab.call_key)] = cfg
    return found
