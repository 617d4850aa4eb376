"""The `KERNELTUNE_*` environment options, read and validated in one place.

Every option is read when it is needed (not at import), so a test or a launcher can set
the environment late. `scoped(**values)` overrides options for a block of code; it is
context-local, so threads and asyncio tasks do not see each other's overrides.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Literal, TypeVar, cast

T = TypeVar("T")

logger = logging.getLogger("kerneltune")

_PREFIX = "KERNELTUNE_"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Option(Generic[T]):
    """One `KERNELTUNE_*` option: `.value` is a scoped override, else the environment,
    else the default; `.override(value)` sets it for a block (context-local).

    Example:
      >>> from kerneltune._src.core import options
      >>> with options.STAMP.override("none"):
      ...     options.STAMP.value
      'none'
    """

    name: str
    default: T
    parse: Callable[[str], T]
    allowed: str
    help: str

    @property
    def value(self) -> T:
        """A scoped override, else the environment, else the default (read on each
        call: it sits on the executor's dispatch path, so it looks up nothing else).

        Raises:
          ValueError: the environment variable holds a value the option does not
            allow; the message names the variable, the value and the legal values.
        """
        overrides = _overrides.get()
        if self.name in overrides:
            return overrides[self.name]  # type: ignore[no-any-return]
        _warn_unknown_variables()
        raw = os.environ.get(env_name(self.name))
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError:
            raise ValueError(
                f"{env_name(self.name)}={raw!r} is not a valid value; allowed: {self.allowed}."
            ) from None

    def override(self, value: T | str) -> contextlib.AbstractContextManager[None]:
        return scoped(**{self.name: value})


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(value)


def _path_or_off(raw: str) -> str | None:
    value = raw.strip()
    if value.lower() in ("off", "none", "0", "false"):
        return None
    if not value:
        raise ValueError(value)
    return value


def _path_list(raw: str) -> tuple[str, ...]:
    # URLs contain ':' so a plain os.pathsep split would cut 'gs://x' apart; a comma is
    # accepted everywhere and os.pathsep only where it cannot be part of a URL.
    parts = [p.strip() for p in raw.replace(",", "\n").splitlines()]
    out: list[str] = []
    for part in parts:
        if "://" in part:
            out.append(part)
        else:
            out.extend(p for p in part.split(os.pathsep) if p)
    return tuple(p for p in out if p)


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError(raw)
    return value


def _count_or(word: str) -> Callable[[str], int | None]:
    """A parser of a whole number >= 0, or `word` (parsed as None)."""

    def parse(raw: str) -> int | None:
        value = raw.strip().lower()
        if value == word:
            return None
        count = int(value)
        if count < 0:
            raise ValueError(raw)
        return count

    return parse


def _choice_option(
    name: str, default: T, legal: tuple[str, ...], help: str, *, unset: str = ""
) -> Option[T]:
    """An option that takes one of `legal` (in any case); `unset` says what leaving it
    unset means, where that is not a value of its own."""

    def parse(raw: str) -> T:
        value = raw.strip().lower()
        if value not in legal:
            raise ValueError(value)
        return cast(T, value)

    allowed = ", ".join(legal) + (f" (or unset: {unset})" if unset else "")
    return Option(name=name, default=default, parse=parse, allowed=allowed, help=help)


def _flag_option(name: str, default: bool, help: str) -> Option[bool]:
    return Option(
        name=name, default=default, parse=_flag, allowed="1, 0, true, false, on, off", help=help
    )


def _seconds_option(name: str, default: float, help: str) -> Option[float]:
    return Option(
        name=name,
        default=default,
        parse=_positive_float,
        allowed="a positive number of seconds",
        help=help,
    )


Platform = Literal["triton", "pallas", "xla"]
Fallback = Literal["autotune", "heuristics", "error"]

PLATFORM: Option[Platform | None] = _choice_option(
    "platform",
    None,
    ("triton", "pallas", "xla"),
    "Force the backend used for platform dispatch.",
    unset="chosen from the device",
)

STAMP: Option[str] = _choice_option(
    "stamp", "hash", ("hash", "json", "none"), "How executor calls are labelled in the HLO."
)

RECORD = _flag_option("record", False, "Record every executor call for offline tuning.")

AUTOTUNE: Option[Fallback] = _choice_option(
    "autotune",
    "autotune",
    ("autotune", "heuristics", "error"),
    "What the default executor does on a cache miss.",
)

CACHE_DIR: Option[str | None] = Option(
    name="cache_dir",
    default="",
    parse=_path_or_off,
    allowed="a directory, a URL (gs://, s3://, memory://...), or off",
    help="Where the default persistent cache lives.",
)

CACHE_READONLY: Option[tuple[str, ...]] = Option(
    name="cache_readonly",
    default=(),
    parse=_path_list,
    allowed="a comma-separated list of directories or URLs",
    help="Read-only caches consulted after the user's cache.",
)

AGREE_TIMEOUT = _seconds_option(
    "agree_timeout", 300.0, "How long processes wait for each other to agree on a config."
)

SHIPPED = _flag_option(
    "shipped", True, "Use the tuned tables shipped with kerneltune (and warm-start from them)."
)

FIRST_CALL_CANDIDATES: Option[int | None] = Option(
    name="first_call_candidates",
    default=3,
    parse=_count_or("all"),
    allowed="a whole number >= 0, or all",
    help=(
        "How many of the candidates predicted fastest the first call of a new key times "
        "beside the heuristic (0: none, the prediction is used untimed; all: the full "
        "search, as before the budget existed)."
    ),
)

FIRST_CALL_KEY_S = _seconds_option(
    "first_call_key_s", 5.0, "How long the first call's tuning of one key may take (then it stops)."
)

FIRST_CALL_PROCESS_S = _seconds_option(
    "first_call_process_s",
    20.0,
    "How long first calls may spend tuning in one process, all keys together (a key "
    "started near the end gets what is left); after that, new keys use their predicted "
    "config untimed.",
)

FIRST_CALL_TRUST_PREDICTION = _flag_option(
    "first_call_trust_prediction",
    True,
    "A new key whose prediction drew on timings of tuned calls nearby uses it untimed "
    "(one compile); off: the first call times the shortlist at every new key.",
)

LOWERING_WORKERS: Option[int | None] = Option(
    name="lowering_workers",
    default=0,
    parse=_count_or("auto"),
    allowed="a whole number >= 0, or auto",
    help=(
        "How many worker processes lower a search's candidates side by side (0, the "
        "default: none, every candidate is lowered in the tuning process; auto: 4 on a "
        "CUDA GPU when the process may use at least 8 CPU cores, else none)."
    ),
)

_OPTIONS: dict[str, Option[Any]] = {
    o.name: o
    for o in (
        PLATFORM,
        STAMP,
        RECORD,
        AUTOTUNE,
        CACHE_DIR,
        CACHE_READONLY,
        AGREE_TIMEOUT,
        SHIPPED,
        FIRST_CALL_CANDIDATES,
        FIRST_CALL_KEY_S,
        FIRST_CALL_PROCESS_S,
        FIRST_CALL_TRUST_PREDICTION,
        LOWERING_WORKERS,
    )
}

_overrides: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "kerneltune_option_overrides", default=types.MappingProxyType({})
)
_checked_environment = False


def env_name(name: str) -> str:
    return _PREFIX + name.upper()


def get(name: str) -> Any:
    """Returns the value of option `name` (see `Option.value`)."""
    return _OPTIONS[name].value


@contextlib.contextmanager
def scoped(**values: Any) -> Iterator[None]:
    """Overrides options inside a `with` block (context-local).

    Example:
      >>> from kerneltune._src.core import options
      >>> with options.scoped(stamp="none"):
      ...     options.STAMP.value
      'none'
    """
    for name, value in values.items():
        if name not in _OPTIONS:
            raise TypeError(f"scoped() got an unknown option {name!r}; known: {sorted(_OPTIONS)}.")
        if isinstance(value, str):
            try:
                values[name] = _OPTIONS[name].parse(value)
            except ValueError:
                raise ValueError(
                    f"option {name}={value!r} is not valid; allowed: {_OPTIONS[name].allowed}."
                ) from None
    token = _overrides.set({**_overrides.get(), **values})
    try:
        yield
    finally:
        _overrides.reset(token)


def _warn_unknown_variables() -> None:
    # A misspelt variable (KERNELTUNE_STAMPS=none) would otherwise be silently ignored.
    global _checked_environment
    if _checked_environment:
        return
    _checked_environment = True
    known = {env_name(n) for n in _OPTIONS}
    for var in os.environ:
        if var.startswith(_PREFIX) and var not in known:
            logger.warning(
                "Unknown environment variable %s is ignored; known: %s.",
                var,
                ", ".join(sorted(known)),
            )


def describe() -> dict[str, Any]:
    """Every option with its current value (for `kerneltune info`)."""
    return {env_name(n): get(n) for n in _OPTIONS}
