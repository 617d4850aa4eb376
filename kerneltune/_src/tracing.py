"""Whether a call is being traced, and running JAX work outside the caller's trace."""

from __future__ import annotations

import contextlib
from typing import Any

import jax

from kerneltune._src import jax_compat


def is_tracing(tree: Any) -> bool:
    """True when any leaf of `tree` is a tracer (the call is inside jit/grad/vmap...)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def outside_traces() -> contextlib.AbstractContextManager[Any]:
    """A context in which JAX operations run eagerly even while the caller is being
    traced (tuning inside the user's jit), without forcing constants inside kernels to
    be concrete as `jax.ensure_compile_time_eval` does."""
    return jax_compat.eval_context()  # type: ignore[no-any-return]
