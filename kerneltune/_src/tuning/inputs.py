"""Concrete inputs to benchmark with when a call is being traced."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import keys


def random_like(tree: Any, *, seed: int = 0) -> Any:
    """Concrete arrays shaped like the array leaves of `tree` (arrays, tracers or
    `ShapeDtypeStruct`s): standard normal data for floating and complex dtypes, zeros
    for integer and boolean ones; other leaves are returned unchanged. The same `seed`
    gives the same data.

    Never all-zero floats: zeros run faster than real data on some hardware and hide
    unwritten outputs.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    specs = tuple(
        (tuple(int(d) for d in leaf.shape), np.dtype(leaf.dtype).name)
        for leaf in leaves
        if keys.is_array(leaf)
    )
    made = iter(_generator(specs)(np.uint32(seed % 2**32)) if specs else ())
    out = [next(made) if keys.is_array(leaf) else leaf for leaf in leaves]
    return jax.tree_util.tree_unflatten(treedef, out)


@functools.lru_cache(maxsize=128)
def _generator(specs: tuple[tuple[tuple[int, ...], str], ...]) -> Callable[[Any], list[jax.Array]]:
    """One compiled program that makes every array of a call: made one by one, eagerly,
    each shape and dtype would compile programs of its own (a second or more per call
    on a GPU, paid again for every key tuned)."""

    def make(seed: jax.Array) -> list[jax.Array]:
        subkeys = jax.random.split(jax.random.PRNGKey(seed), len(specs))
        return [
            _random_array(k, shape, np.dtype(dtype)) for k, (shape, dtype) in zip(subkeys, specs)
        ]

    return jax.jit(make)


def _random_array(key: jax.Array, shape: tuple[int, ...], dtype: np.dtype) -> jax.Array:
    if jnp.issubdtype(dtype, jnp.complexfloating):
        real = jax.random.normal(key, shape, dtype=jnp.float32)
        return (real + 1j * real[..., ::-1] if shape else real).astype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jax.random.normal(key, shape, dtype=jnp.float32).astype(dtype)
    return jnp.zeros(shape, dtype)


def concrete_inputs(arrays: Sequence[Any], *, seed: int = 0) -> list[jax.Array]:
    """The array leaves of a call, made ready to time: device arrays stay as they are,
    NumPy arrays are put on the device once (not on every call), and tracers (the
    caller is inside jit/grad/vmap) and `ShapeDtypeStruct` stand-ins become random data
    of the same shape and dtype (see `random_like`).
    """
    out: list[jax.Array] = []
    for i, a in enumerate(arrays):
        if isinstance(a, jax.core.Tracer):
            a = jax.ShapeDtypeStruct(tuple(a.shape), a.dtype)
        if isinstance(a, jax.ShapeDtypeStruct):
            out.append(random_like(a, seed=seed + i))
        elif isinstance(a, np.ndarray):
            out.append(jax.device_put(a))
        else:
            out.append(a)
    return out


def all_zero_floats(arrays: Sequence[Any]) -> list[int]:
    """Positions of floating-point arrays whose elements are all zero (timing on zeros
    flatters some kernels and hides unwritten outputs)."""
    zero = []
    for i, a in enumerate(arrays):
        if jnp.issubdtype(a.dtype, jnp.inexact) and a.size and not bool(jnp.any(a != 0)):
            zero.append(i)
    return zero


def rotation_sets(
    arrays: Sequence[jax.Array],
    *,
    min_bytes: int = 128 << 20,
    max_sets: int = 8,
    max_bytes: int = 2 << 30,
) -> list[list[jax.Array]]:
    """`arrays` followed by copies of it in distinct buffers, enough that cycling
    through them touches at least `min_bytes` (about twice the last-level cache), so a
    small kernel is timed reading memory, not a warm cache. The copies hold the same
    values, so every set gives the same output.

    A set of half `min_bytes` or more (about the cache or more) is not copied: reading
    it through evicts what the previous run left, so a copy would only add memory
    (a 104 MiB matmul key's second set was a tenth of its tuning peak).

    At most `max_sets` sets and `max_bytes` of copies in all.
    """
    per_set = sum(int(a.size) * np.dtype(a.dtype).itemsize for a in arrays)
    if per_set == 0 or 2 * per_set >= min_bytes:
        return [list(arrays)]
    wanted = -(-min_bytes // per_set)  # ceil
    allowed = max(1, 1 + max_bytes // per_set)
    count = max(1, min(wanted, max_sets, allowed))
    sets = [list(arrays)]
    for _ in range(count - 1):
        sets.append([jnp.copy(a) for a in arrays])
    return sets
