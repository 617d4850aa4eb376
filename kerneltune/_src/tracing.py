"""Whether a call is being traced, and running JAX work outside the caller's trace."""

from __future__ import annotations

import contextlib
from typing import Any

import jax


def is_tracing(tree: Any) -> bool:
    """True when any leaf of `tree` is a tracer (the call is inside jit/grad/vmap...)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def outside_traces() -> contextlib.AbstractContextManager[Any]:
    """A context in which JAX operations run eagerly even while the caller is being
    traced (tuning inside the user's jit), without forcing constants inside kernels to
    be concrete as `jax.ensure_compile_time_eval` does."""
    make = getattr(jax.core, "eval_context", None)
    if make is None:  # pragma: no cover - moved in some JAX version
        from jax._src import core

        make = core.eval_context
    return make()  # type: ignore[no-any-return]
