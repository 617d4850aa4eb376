"""Concrete inputs to benchmark with when a call is being traced."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src import keys


def random_like(tree: Any, *, seed: int = 0) -> Any:
    """Concrete arrays shaped like the array leaves of `tree` (arrays, tracers or
    `ShapeDtypeStruct`s): standard normal data for floating and complex dtypes, zeros
    for integer and boolean ones; other leaves are returned unchanged.

    Never all-zero floats: zeros run faster than real data on some hardware and hide
    unwritten outputs.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    key = jax.random.PRNGKey(seed)
    out = []
    for leaf in leaves:
        if not keys.is_array(leaf):
            out.append(leaf)
            continue
        key, sub = jax.random.split(key)
        out.append(_random_array(sub, tuple(leaf.shape), np.dtype(leaf.dtype)))
    return jax.tree_util.tree_unflatten(treedef, out)


def _random_array(key: jax.Array, shape: tuple[int, ...], dtype: np.dtype) -> jax.Array:
    if jnp.issubdtype(dtype, jnp.complexfloating):
        real = jax.random.normal(key, shape, dtype=jnp.float32)
        return (real + 1j * real[..., ::-1] if shape else real).astype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jax.random.normal(key, shape, dtype=jnp.float32).astype(dtype)
    return jnp.zeros(shape, dtype)
