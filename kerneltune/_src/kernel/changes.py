"""Programs built from a kernel hold its attributes as they were when traced (a factor,
an array, a flag). Whoever keeps such programs registers here how to drop them, and
`Kernel.__setattr__` calls that when one of the kernel's attributes is set, so that the
next call builds afresh from the kernel as it is now (as a fresh `jax.jit` trace would).
Nothing here runs on a call's hot path: only when an attribute is set."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

#: id of a kernel -> what drops the programs built from it (each called once).
_forgetters: dict[int, list[Callable[[], object]]] = {}
_lock = threading.Lock()


def on_change(kernel: Any, forget: Callable[[], object]) -> None:
    """Calls `forget()` the next time an attribute of `kernel` is set."""
    kid = id(kernel)
    with _lock:
        first = kid not in _forgetters
        _forgetters.setdefault(kid, []).append(forget)
    if first:
        try:
            # Out of the table before the id can name another object.
            weakref.finalize(kernel, _collected, kid)
        except TypeError:  # no weak references (slots): the programs keep it alive
            pass


def changed(kernel: Any) -> None:
    """An attribute of `kernel` was set: drops every program built from it."""
    with _lock:
        forgets = _forgetters.pop(id(kernel), ())
    for forget in forgets:
        forget()


def watched(kernel: Any) -> bool:
    return id(kernel) in _forgetters


def _collected(kid: int) -> None:
    with _lock:
        _forgetters.pop(kid, None)
