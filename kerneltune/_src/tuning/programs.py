"""The programs a tuning builds around a candidate: its arguments split into arrays and
constants, the forward + backward program that validates gradients too, the compile
stage, and advisory work run in the background."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from kerneltune._src.core import keys
from kerneltune._src.tuning import compiling, memory

logger = logging.getLogger("kerneltune")


def split_static(args: Sequence[Any], kwargs: dict[str, Any]):
    """Splits (args, kwargs) into their array leaves and a function that rebuilds them
    from new array leaves (non-array leaves stay as constants)."""
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
    positions = [i for i, leaf in enumerate(leaves) if keys.is_array(leaf)]
    arrays = [leaves[i] for i in positions]

    def rebuild(new_arrays: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        full = list(leaves)
        for i, a in zip(positions, new_arrays, strict=True):
            full[i] = a
        a, k = jax.tree_util.tree_unflatten(treedef, full)
        return a, k

    return arrays, rebuild


def with_backward(call: Callable[..., Any]) -> Callable[..., Any]:
    """Forward + backward: the output and the gradient of the sum of its floating-point
    leaves with respect to every floating-point input (so validation covers both)."""

    def forward_and_grads(*arrays: Any) -> Any:
        float_positions = [i for i, a in enumerate(arrays) if jnp.issubdtype(a.dtype, jnp.inexact)]
        if not float_positions:
            return call(*arrays), ()

        def loss(*float_arrays: Any) -> Any:
            full = list(arrays)
            for i, a in zip(float_positions, float_arrays, strict=True):
                full[i] = a
            out = call(*full)
            leaves = [
                leaf
                for leaf in jax.tree_util.tree_leaves(out)
                if jnp.issubdtype(leaf.dtype, jnp.inexact)
            ]
            total = sum((jnp.sum(leaf.real.astype(jnp.float32)) for leaf in leaves), jnp.float32(0))
            return total, out

        grads, out = jax.grad(loss, argnums=tuple(range(len(float_positions))), has_aux=True)(
            *[arrays[i] for i in float_positions]
        )
        return out, grads

    return forward_and_grads


def compile_lowered(lowered: Any, what: str = "this candidate") -> Any:
    """The second build stage: a lowered program's executable, refused (`DoesNotFit`,
    recorded as "oom") when it would not fit in the device memory left."""
    compiled = lowered.compile()
    memory.check_fits(compiled, what)
    return compiled


class Background:
    """Runs `fn(*args)` on a daemon thread; `result()` waits for it (None if it
    raised: what it computes is advisory)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._result: Any = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        with compiling.exit_waits_for_this():  # it may compile: exit must wait
            try:
                self._result = fn(*args)
            except Exception as e:
                logger.debug("background check failed: %s", e)

    def result(self, timeout_s: float = 60.0) -> Any:
        self._thread.join(timeout_s)
        return self._result
