"""The jitted programs behind eager calls: one per (kernel, config, static signature).

An eager `executor(kernel, x)` must not run op by op: the executor traces the kernel
once per signature into a `Program` and calls it with the call's array leaves. A
signature is the kernel (its class and attributes), the pytree structure, every
non-array leaf (by value), the config and the calling options; arrays are the
program's inputs.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import jax

from kerneltune._src.core import keys
from kerneltune._src.kernel.base import EXECUTOR_OPTIONS, Kernel


class Same:
    """Hashes and compares by identity, and keeps its value alive (so its id is never
    another object's while a key holds it)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.value is self.value


class Weak:
    """A kernel known by identity, held weakly: hashes and compares by its id. Whoever
    keys by it drops the keys when the kernel is collected (`weakref.finalize`), before
    its id can name another object."""

    __slots__ = ("_id", "ref")

    def __init__(self, value: Any) -> None:
        self.ref = weakref.ref(value)
        self._id = id(value)

    def __hash__(self) -> int:
        return self._id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Weak) and other._id == self._id


def _by_identity(kernel: Any) -> Any:
    try:
        return Weak(kernel)
    except TypeError:  # slots without __weakref__: kept alive instead
        return Same(kernel)


def hashable(value: Any) -> Any:
    """`value` when it hashes, else its stable JSON (configs and specs as dict keys); a
    value whose stable JSON does not pin it down (arrays in it, known by shape only; a
    callable object's attributes) by identity."""
    try:
        hash(value)
        return value
    except TypeError:
        pass
    text = keys.stable_json(value)
    if '"__array__"' in text or '"__callable__"' in text:
        return ("object", Same(value))
    return ("json", text)


#: Attribute types whose values alone say what a kernel computes.
_VALUE_TYPES = (str, bool, int, type(None))


def kernel_identity(kernel: Kernel[Any, Any]) -> Any:
    """What tells kernels apart for sharing a program: a kernel whose attributes are
    all strings, numbers, booleans or None is known by its class and those values, so
    a kernel made afresh for each eager call (`RowSum()(x)`) reuses the first one's
    program instead of compiling again (about 50 ms a call on a CPU). Any other kernel
    (another attribute type, slots) is itself, by identity (a dataclass kernel does not
    hash, nor a frozen one holding an array): its own program, which does not keep it
    alive where it can be weakly referenced."""
    if any(getattr(c, "__slots__", ()) for c in type(kernel).__mro__ if "__slots__" in vars(c)):
        return _by_identity(kernel)
    state = []
    for name, value in sorted(vars(kernel).items()):
        if type(value) in _VALUE_TYPES:
            state.append((name, type(value), value))
        elif type(value) is float:
            state.append((name, float, repr(value)))  # -0.0 is not 0.0 here
        else:
            return _by_identity(kernel)
    return (type(kernel), tuple(state))


#: The executor's own options, which the callable `Executor.compile` returns refuses.
_OPTION_NAMES = frozenset(EXECUTOR_OPTIONS)


def refuse_options(kwargs: dict[str, Any]) -> None:
    """Raises if a call of the callable `Executor.compile` returned passes one of the
    executor's options (fixed when compiling)."""
    if not _OPTION_NAMES.isdisjoint(kwargs):
        fixed = sorted(_OPTION_NAMES.intersection(kwargs))
        raise TypeError(
            f"{fixed[0]}= cannot be passed to the callable compile() returned: the "
            f"executor's options {list(EXECUTOR_OPTIONS)} are fixed when compiling; pass "
            "them to compile()."
        )


@dataclasses.dataclass(frozen=True)
class CallOptions:
    """How a call asked to run: the executor's own keyword arguments
    (`Executor.__call__`'s `cfg`, `stamp`, `method`, `mesh`, `in_specs`, `out_specs`)."""

    cfg: Any = None
    stamp: bool = True
    method: str | None = None
    mesh: Any = None
    in_specs: Any = None
    out_specs: Any = None

    def invocation_fields(self) -> dict[str, Any]:
        """The `Invocation` fields these options set."""
        return {
            "override_cfg": self.cfg,
            "stamp": self.stamp,
            "method": self.method,
            "mesh": self.mesh,
            "in_specs": self.in_specs,
            "out_specs": self.out_specs,
        }

    def check(self, kernel: Any) -> None:
        """Checks a call as the user wrote it: the kernel, and these options."""
        if not isinstance(kernel, Kernel):
            raise TypeError(
                f"expected a kerneltune.Kernel instance, got {type(kernel).__qualname__}."
            )
        if not isinstance(self.stamp, bool):
            raise TypeError(f"stamp must be a bool, got {self.stamp!r}.")
        if self.method not in (None, "shard_map"):
            raise ValueError(f"method must be None or 'shard_map', got {self.method!r}.")
        if self.method == "shard_map" and (
            self.mesh is None or self.in_specs is None or self.out_specs is None
        ):
            raise ValueError("method='shard_map' needs mesh=, in_specs= and out_specs=.")
        if self.method is None:
            for name in ("mesh", "in_specs", "out_specs"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}= is given but method=None: the mesh and the specs are "
                        "used only by method='shard_map' (pass it to run the kernel per "
                        "shard)."
                    )


@dataclasses.dataclass(frozen=True)
class Signature:
    """What makes two calls share a program (`key`), and how to rebuild a call from
    the program's inputs."""

    key: tuple[Any, ...]
    leaves: list[Any]
    treedef: Any
    positions: tuple[int, ...]  # the leaves that are arrays: the program's inputs


def signature(
    kernel: Kernel[Any, Any],
    cfg: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    call: CallOptions,
    stamp_mode: str,
) -> Signature:
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    positions = tuple(i for i, leaf in enumerate(leaves) if keys.is_array(leaf))
    statics = tuple(
        (i, type(leaves[i]), hashable(leaves[i])) for i in range(len(leaves)) if i not in positions
    )
    key = (
        kernel_identity(kernel),
        hashable(cfg),
        treedef,
        statics,
        call.stamp,
        stamp_mode,
        call.method,
        hashable(call.mesh) if call.mesh is not None else None,
        hashable(call.in_specs),
        hashable(call.out_specs),
    )
    return Signature(key, leaves, treedef, positions)


class Program:
    """One jitted program: `trace(args, kwargs)` for one signature, called with the
    array leaves only."""

    def __init__(
        self, trace: Callable[[tuple[Any, ...], dict[str, Any]], Any], sig: Signature
    ) -> None:
        self._positions = positions = sig.positions
        static_leaves, treedef = list(sig.leaves), sig.treedef

        def body(*dyn: Any) -> Any:
            full = list(static_leaves)
            for i, x in zip(positions, dyn, strict=True):
                full[i] = x
            args, kwargs = jax.tree_util.tree_unflatten(treedef, full)
            return trace(tuple(args), dict(kwargs))

        # Called with the array leaves only, in order: for the common all-array call
        # those are exactly the positional arguments.
        self.dynamic = jax.jit(body)

    def takes_exactly(self, num_args: int) -> bool:
        """True when the program's inputs are the call's first `num_args` leaves and
        nothing else, so the eager table can call `dynamic(*args)` directly."""
        return self._positions == tuple(range(num_args))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        return self.dynamic(*(leaves[i] for i in self._positions))
