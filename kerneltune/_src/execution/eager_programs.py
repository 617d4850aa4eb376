"""The jitted programs behind eager calls: one per (kernel, config, static signature).

An eager `executor(kernel, x)` must not run op by op: the executor traces the kernel
once per signature into a `Program` and calls it with the call's array leaves. A
signature is the kernel (its class and attributes), the pytree structure, every
non-array leaf (by value), the config and the calling options; arrays are the
program's inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from kerneltune._src.core import keys
from kerneltune._src.kernel.base import Kernel


def hashable(value: Any) -> Any:
    """`value` when it hashes, else its stable JSON (configs and specs as dict keys)."""
    try:
        hash(value)
        return value
    except TypeError:
        return ("json", keys.stable_json(value))


def kernel_identity(kernel: Kernel[Any, Any]) -> Any:
    """What tells kernels apart for sharing a program: kernels of one class with equal
    attributes trace the same program, so a kernel made afresh for each eager call
    (`RowSum()(x)`) reuses the first one's instead of compiling again (about 50 ms a
    call on a CPU) and keeping one more program. A kernel with an attribute that does
    not hash by value (an array, a list) is told apart by identity."""
    try:
        state = tuple(sorted(vars(kernel).items()))
        hash(state)
    except TypeError:
        return kernel
    return (type(kernel), state)


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
