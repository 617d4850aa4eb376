"""`vmap_with_config` and `pmap_with_config`: one config for a whole batch.

The config is chosen once, from one example's shapes (the first element along the
mapped axes), and the same config runs for every element or device. With concrete
arguments the example is real data, so tuning (when the policy allows it) times the
kernel on it; under a trace it times random data of the same shapes.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from kerneltune._src.core import jax_compat, keys, options, scope
from kerneltune._src.execution import eager_table
from kerneltune._src.execution.default import default_executor
from kerneltune._src.execution.eager_programs import CallOptions
from kerneltune._src.execution.executor import Executor
from kerneltune._src.kernel import changes
from kerneltune._src.kernel.base import Kernel

_ARRAY_IMPL = jax_compat.array_impl_type()


def vmap_with_config(
    kernel: Kernel[Any, Any], in_axes: Any = 0, *, executor: Executor[Any, Any] | None = None
) -> Callable[..., Any]:
    """`jax.vmap` of `kernel` with one config chosen for the whole batch.

    Args:
      kernel: the kernel.
      in_axes: as for `jax.vmap`, over the positional arguments; keyword arguments are
        not mapped (they are static values, or arrays shared by every element).
      executor: the executor choosing the config (default: `default_executor()`).

    Returns:
      `f(*args, **kwargs)`; `f.choose_config(*args, **kwargs)` tells which config a call
      would use.

    Example:
      >>> import jax.numpy as jnp, kerneltune
      >>> from kerneltune.kernels import Softmax
      >>> ex = kerneltune.Executor(kerneltune.ConfigSelectorChain(kerneltune.ConfigCache()))
      >>> vmap_with_config(Softmax(), executor=ex)(jnp.ones((3, 2, 4))).shape
      (3, 2, 4)
    """
    return _Batched(kernel, in_axes, executor, "vmap", None)


def pmap_with_config(
    kernel: Kernel[Any, Any],
    axis_name: Any = "devices",
    in_axes: Any = 0,
    *,
    executor: Executor[Any, Any] | None = None,
) -> Callable[..., Any]:
    """`jax.pmap` of `kernel` over the local devices with one config for every device,
    chosen from one device's shapes.

    Args:
      kernel: the kernel.
      axis_name: the mapped axis's name (collectives inside the kernel can use it).
      in_axes: as for `jax.pmap`, over the positional arguments; keyword arguments are
        not mapped.
      executor: the executor choosing the config (default: `default_executor()`).
    """
    return _Batched(kernel, in_axes, executor, "pmap", axis_name)


class _Batched:
    def __init__(
        self, kernel: Kernel[Any, Any], in_axes: Any, executor: Any, how: str, axis_name: Any
    ) -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(
                f"expected a kerneltune.Kernel instance, got {type(kernel).__qualname__}."
            )
        if executor is not None and not isinstance(executor, Executor):
            raise TypeError(
                f"executor must be an Executor or None, got {type(executor).__qualname__}."
            )
        _check_axes(in_axes)
        self.kernel = kernel
        self.in_axes = in_axes
        self.executor = executor
        self.how = how
        self.axis_name = axis_name
        # (executor, generation, scope, avals, axes, kwargs) -> program; dropped
        # implicitly when the executor's choices may have changed (its generation).
        self._programs: dict[Any, Callable[..., Any]] = {}
        self.__name__ = f"{how}_with_config({kernel.op_id})"

    def _executor(self) -> Executor[Any, Any]:
        return self.executor if self.executor is not None else default_executor()

    def choose_config(self, *args: Any, **kwargs: Any) -> Any:
        """The config one element of this batch gets."""
        ex = self._executor()
        axes = _axes_per_arg(self.in_axes, args)
        return ex.choose_config(self.kernel, *_example(args, axes), **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ex = self._executor()
        axes = _axes_per_arg(self.in_axes, args)
        fast = self._fast_key(ex, args, axes, kwargs)
        if fast is not None:
            program = self._programs.get(fast)
            if program is not None:
                return program(*args)
        inv, _, _ = ex._invocation(self.kernel, _example(args, axes), kwargs)
        cfg = ex.chooser.choose(inv, self.kernel)
        if options.RECORD.value:
            from kerneltune._src.kernel import recording

            recording.record_invocation(self.kernel, inv)
        mapped = self._mapped(ex, cfg, axes, kwargs)
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs))):
            return mapped(*args)
        program = jax.jit(mapped) if self.how == "vmap" else mapped
        if fast is not None:
            if not self._programs:
                # The programs hold the kernel's attributes as they are now.
                changes.on_change(
                    self.kernel, functools.partial(_forget_programs, weakref.ref(self))
                )
            self._programs[fast] = program
        return program(*args)

    def _mapped(
        self, ex: Executor[Any, Any], cfg: Any, axes: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[..., Any]:
        kernel = self.kernel

        def one(*example: Any) -> Any:
            inv, p_args, p_kwargs = ex._invocation(kernel, example, kwargs, CallOptions(cfg=cfg))
            return ex._apply(kernel, inv, cfg, p_args, p_kwargs)

        if self.how == "vmap":
            return jax.vmap(one, in_axes=axes)
        return jax.pmap(one, axis_name=self.axis_name, in_axes=axes)

    def _fast_key(
        self, ex: Executor[Any, Any], args: tuple[Any, ...], axes: Any, kwargs: dict[str, Any]
    ) -> Any:
        if not all(type(a) is _ARRAY_IMPL for a in args):
            return None
        # Keyword values by value and type, as the executor's eager table keys them.
        if not all(map(eager_table.pinned_by_type, kwargs.values())):
            return None
        key = (
            ex.uid,
            ex._generation,
            scope.current(),
            axes,
            *[a.aval for a in args],
            *kwargs.items(),
            *map(type, kwargs.values()),
        )
        try:
            hash(key)
        except TypeError:
            return None
        return key


def _check_axes(in_axes: Any) -> None:
    for leaf in jax.tree_util.tree_leaves(in_axes):
        if not isinstance(leaf, int) or isinstance(leaf, bool):
            raise TypeError(f"in_axes entries must be ints or None, got {leaf!r} in {in_axes!r}.")


def _axes_per_arg(in_axes: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    if in_axes is None or isinstance(in_axes, int):
        return (in_axes,) * len(args)
    axes = tuple(in_axes)
    if len(axes) != len(args):
        raise ValueError(
            f"in_axes has {len(axes)} entries for {len(args)} positional arguments: {in_axes!r}."
        )
    return axes


def _example(args: tuple[Any, ...], axes: tuple[Any, ...]) -> tuple[Any, ...]:
    """The first element of every mapped argument (the mapped axis removed)."""

    def take(axis: Any, subtree: Any) -> Any:
        def leaf(x: Any) -> Any:
            if axis is None or not keys.is_array(x):
                return x
            if x.ndim == 0:
                raise ValueError(f"cannot map over axis {axis} of a scalar argument.")
            if isinstance(x, np.ndarray):
                return np.take(x, 0, axis=axis)
            return jax.lax.index_in_dim(x, 0, axis % x.ndim, keepdims=False)

        return jax.tree_util.tree_map(leaf, subtree)

    return tuple(
        jax.tree_util.tree_map(take, ax, arg, is_leaf=lambda a: a is None)
        for ax, arg in zip(axes, args, strict=True)
    )


def _forget_programs(wrapper_ref: Callable[[], Any]) -> None:
    wrapper = wrapper_ref()
    if wrapper is not None:
        wrapper._programs.clear()
