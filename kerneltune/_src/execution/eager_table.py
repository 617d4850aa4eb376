"""The eager dispatch table: a repeated eager call's signature straight to its jitted
program, so that the hot path costs a tuple build and a dict lookup.

Kernels are named by `id()`, so that the table keeps none alive: a kernel made afresh
for each call (`RowSum()(x)`) would otherwise add an entry a call. Each remembered
kernel gets a finalizer that takes its entries out when it is collected, before its
id can name another object. The table is dropped whole when the chooser's choices may
have changed (`invalidate`); an entry whose choice such a change overtook is not kept.
"""

from __future__ import annotations

import functools
import numbers
import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any

from kerneltune._src.core import jax_compat, scope
from kerneltune._src.kernel import changes


class EagerTable:
    """Entries by (kernel id, stamp, scope, avals, keyword values); see the module."""

    def __init__(self) -> None:
        #: Read by the executor's hot path without the lock (a dict lookup is atomic).
        self.entries: dict[Any, Callable[..., Any]] = {}
        #: Bumped by every invalidation: a choice made before it is not remembered.
        self.generation = 0
        self._keys_of: dict[int, list[Any]] = {}
        self._watched: set[int] = set()
        # Reentrant: a collection inside `remember` may run `_forget` on this thread.
        self._lock = threading.RLock()

    def invalidate(self) -> None:
        with self._lock:
            self.generation += 1
            self.entries.clear()
            self._keys_of.clear()

    def remember(self, kernel: Any, key: Any, entry: Callable[..., Any], generation: int) -> None:
        """Puts `entry` under `key` until `kernel` is collected. A kernel that does not
        hash (a mutable dataclass: its attributes may change) or cannot be weakly
        referenced is not remembered, nor an entry chosen before an invalidation."""
        try:
            hash(kernel)
        except TypeError:
            return
        kid = id(kernel)
        with self._lock:
            if generation != self.generation:
                return
            if kid not in self._watched:
                try:
                    weakref.finalize(kernel, _forget, weakref.ref(self), kid)
                except TypeError:
                    return
                self._watched.add(kid)
                # Its entries run programs holding its attributes as they are now.
                changes.on_change(kernel, functools.partial(_forget, weakref.ref(self), kid))
            self._keys_of.setdefault(kid, []).append(key)
            self.entries[key] = entry


def _forget(table_ref: Callable[[], EagerTable | None], kid: int) -> None:
    """A kernel object was collected: its entries leave the table."""
    table = table_ref()
    if table is None:
        return
    with table._lock:
        table._watched.discard(kid)
        for key in table._keys_of.pop(kid, ()):
            table.entries.pop(key, None)


def pinned_by_type(value: Any) -> bool:
    """True when any value equal to `value` and of its type is the same static value,
    so that a table keyed by keyword values and their types may remember it. False
    for tuples and frozensets holding numbers: `(2,) == (2.0,)`, and such a key holds
    only the outer type."""
    if isinstance(value, (tuple, frozenset)):
        return all(not isinstance(v, numbers.Number) and pinned_by_type(v) for v in value)
    return True


_ARRAY_IMPL = jax_compat.array_impl_type()
_current_scope = scope._current.get
_aval = operator.attrgetter("aval")


def key_of(kernel: Any, stamp: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The table's key for a call of concrete JAX arrays as positional arguments and
    hashable keyword values (avals carry a cached hash), else None.
    `Executor.__call__` builds the same key inline (its hot path).

    Keyword values are compared by `==` and their type (2 == 2.0 and True == 1, but
    `x ** 2.0` is a float where `x ** 2` is not); a container holding numbers is not
    remembered, as `(2,) == (2.0,)` and the key holds only its outer type."""
    if not all(type(a) is _ARRAY_IMPL for a in args):
        return None
    if not all(map(pinned_by_type, kwargs.values())):
        return None
    key = (
        id(kernel),
        stamp,
        _current_scope(),
        *map(_aval, args),
        *kwargs.items(),
        *(map(type, kwargs.values()) if kwargs else ()),
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key
