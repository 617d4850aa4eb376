"""The one place kerneltune reaches into JAX's private modules.

Each access is wrapped in a function that says what it needs, with a fallback where
JAX moved the name, so a JAX release that reorganises its internals breaks this module
alone (and its tests), not the layers above.
"""

from __future__ import annotations

from typing import Any


def array_impl_type() -> type:
    """The class of a concrete `jax.Array` (`ArrayImpl`), found without creating an
    array: creating one would start a backend, and importing kerneltune must not."""
    try:
        from jax._src.array import ArrayImpl
    except ImportError:  # moved: fall back on a real array, at first use only
        import jax.numpy as jnp

        return type(jnp.zeros(()))
    return ArrayImpl


def backends_initialized() -> bool:
    """True when this process has started a JAX backend (used by tests and by the
    parent of `kerneltune tune --workers`, which must not hold a GPU)."""
    from jax._src import xla_bridge

    backends: Any = getattr(xla_bridge, "_backends", None)
    return bool(backends)
