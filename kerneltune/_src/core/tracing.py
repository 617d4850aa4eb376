"""Whether a call is being traced, and running JAX work outside the caller's trace."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import jax

from kerneltune._src.core import jax_compat


def is_tracing(tree: Any) -> bool:
    """True when any leaf of `tree` is a tracer (the call is inside jit/grad/vmap...)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def is_differentiated(tree: Any) -> bool:
    """True when a leaf of `tree` carries a tangent: the call is being differentiated
    (`jax.grad`, `jax.vjp`, `jax.jvp`, `jax.linearize`), directly or under `vmap`.

    A call inside a `jax.jit` or `jax.checkpoint` that sits under the gradient is traced
    before JAX differentiates it: its inputs carry no tangent, so it reads as a forward
    call.
    """
    ad_tracers = None
    for x in jax.tree_util.tree_leaves(tree):
        while isinstance(x, jax.core.Tracer):
            if ad_tracers is None:
                ad_tracers = jax_compat.differentiation_tracer_types()
            if isinstance(x, ad_tracers):
                return True
            x = getattr(x, "val", None)  # a batching (vmap) tracer wraps its value
    return False


def outside_traces() -> contextlib.AbstractContextManager[Any]:
    """A context in which JAX operations run eagerly even while the caller is being
    traced (tuning inside the user's jit), without forcing constants inside kernels to
    be concrete as `jax.ensure_compile_time_eval` does."""
    return jax_compat.eval_context()  # type: ignore[no-any-return]


_keyword_cotangents_zero: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kerneltune_keyword_cotangents_zero", default=False
)


@contextlib.contextmanager
def keyword_cotangents_zero() -> Iterator[None]:
    """Inside, a kernel's custom gradient gives array keyword arguments a zero
    cotangent instead of raising: for the tuner, which times a backward with respect to
    every floating-point input, not a gradient anyone reads."""
    token = _keyword_cotangents_zero.set(True)
    try:
        yield
    finally:
        _keyword_cotangents_zero.reset(token)


def keyword_cotangents_are_zero() -> bool:
    return _keyword_cotangents_zero.get()
