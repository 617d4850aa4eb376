"""Context-local selection state: overlays, policy overrides, forward-only tuning, and
whether calls are being recorded.

All of them are scoped with `with` blocks, are private to the thread or asyncio task that
entered them, and take part in JAX's trace cache: a function jitted outside a block and
called inside it is traced again (and picks the block's configs), and after the block it
gets its old trace back. That is done with a JAX user context (`jax.make_user_context`)
whose value is the current `Scope`.

A second, global user context holds the *selection epoch*: a trace that settled a key
on a provisional config (the heuristic, for a key that had no tuned config yet) must not
outlive the tuning. When such a key later gets a config, the epoch moves on, so every
jitted function traces once more (now finding the tuned config), and only then.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import jax

from kerneltune._src.core import jax_compat, keys

OverlayKey = tuple[str, str, str]  # (device fingerprint, "op@vN", call key)


class Overlay:
    """An immutable snapshot of `{(device, op_id_v, call_key): cfg}` configs.

    Equal overlays (same entries) compare equal, so entering the same configs again
    reuses JAX's earlier trace instead of tracing anew.
    """

    __slots__ = ("_hash", "_identity", "entries")
    _fallback_ids = itertools.count()

    def __init__(self, entries: Mapping[OverlayKey, Any]) -> None:
        self.entries = dict(entries)
        for key in self.entries:
            if not (
                isinstance(key, tuple) and len(key) == 3 and all(isinstance(p, str) for p in key)
            ):
                raise TypeError(
                    "overlay keys must be (device_fingerprint, op_id_v, call_key) string "
                    f"triples, got {key!r}."
                )
        try:
            self._identity: Any = keys.stable_json(
                sorted(self.entries.items(), key=lambda kv: kv[0])
            )
        except TypeError:
            # Configs stable_json cannot encode: identity-based (a new trace per overlay).
            self._identity = ("overlay", next(self._fallback_ids))
        self._hash = hash(self._identity)

    def get(self, key: OverlayKey) -> Any:
        return self.entries.get(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Overlay) and self._identity == other._identity

    def __len__(self) -> int:
        return len(self.entries)


@dataclasses.dataclass(frozen=True)
class Scope:
    """The selection state in force here. Hashable: it is part of JAX's jit cache key."""

    overlays: tuple[Overlay, ...] = ()  # innermost last
    # (selector uid or None for "every selector", sorted policy field updates)
    policy_updates: tuple[tuple[int | None, tuple[tuple[str, Any], ...]], ...] = ()
    forward_only: bool = False
    recording: bool = False
    _hash: int = dataclasses.field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Hashed on every eager call and every jit dispatch: compute it once.
        object.__setattr__(
            self,
            "_hash",
            hash((self.overlays, self.policy_updates, self.forward_only, self.recording)),
        )

    def __hash__(self) -> int:
        return self._hash

    def overlay_lookup(self, key: OverlayKey) -> Any:
        for overlay in reversed(self.overlays):
            cfg = overlay.get(key)
            if cfg is not None:
                return cfg
        return None

    def policy_updates_for(self, selector_uid: int) -> dict[str, Any]:
        updates: dict[str, Any] = {}
        for uid, items in self.policy_updates:
            if uid is None or uid == selector_uid:
                updates.update(items)
        return updates


EMPTY = Scope()
_current: contextvars.ContextVar[Scope] = contextvars.ContextVar("kerneltune_scope", default=EMPTY)
_make_user_context = getattr(jax, "make_user_context", None)
_jax_context = _make_user_context(None) if _make_user_context is not None else None


def current() -> Scope:
    return _current.get()


@contextlib.contextmanager
def entered(scope: Scope) -> Iterator[Scope]:
    """Makes `scope` current inside the block (and in JAX's trace-cache key)."""
    token = _current.set(scope)
    try:
        if _jax_context is None:
            yield scope
        else:
            with _jax_context(None if scope == EMPTY else scope):
                yield scope
    finally:
        _current.reset(token)


def with_overlay(overlay: Overlay) -> contextlib.AbstractContextManager[Scope]:
    now = current()
    return entered(dataclasses.replace(now, overlays=(*now.overlays, overlay)))


def with_policy_updates(
    selector_uid: int | None, updates: Mapping[str, Any]
) -> contextlib.AbstractContextManager[Scope]:
    now = current()
    items = tuple(sorted(updates.items()))
    return entered(
        dataclasses.replace(now, policy_updates=(*now.policy_updates, (selector_uid, items)))
    )


def with_forward_only() -> contextlib.AbstractContextManager[Scope]:
    return entered(dataclasses.replace(current(), forward_only=True))


def with_recording() -> contextlib.AbstractContextManager[Scope]:
    return entered(dataclasses.replace(current(), recording=True))


# -- the selection epoch --------------------------------------------------------------

_epoch_context = _make_user_context(0) if _make_user_context is not None else None
_epoch_numbers = itertools.count(1)
_provisional: set[OverlayKey] = set()
_provisional_lock = threading.Lock()


def chose_provisionally(key: OverlayKey) -> None:
    """`key` was settled on a config that a later tuning may replace."""
    if key not in _provisional:
        with _provisional_lock:
            _provisional.add(key)


def settled(key: OverlayKey) -> None:
    """`key` now has a config: traces that chose provisionally for it are retired."""
    if key not in _provisional:
        return
    with _provisional_lock:
        if key not in _provisional:
            return
        _provisional.discard(key)
        if _epoch_context is not None:
            jax_compat.set_user_context_global(_epoch_context, next(_epoch_numbers))
