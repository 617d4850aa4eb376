"""Concrete inputs to benchmark with when a call is being traced."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import codec, keys


def random_like(tree: Any, *, seed: int = 0) -> Any:
    """Concrete arrays shaped like the array leaves of `tree` (arrays, tracers or
    `ShapeDtypeStruct`s): standard normal data for floating and complex dtypes, zeros
    for integer and boolean ones; other leaves are returned unchanged. The same `seed`
    gives the same data.

    Never all-zero floats: zeros run faster than real data on some hardware and hide
    unwritten outputs.

    The data is made on the host and copied to the device: a device random program
    compiles anew for every shape (0.9 s a key on an H100, a quarter of tuning a
    matmul key), a copy compiles nothing.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    out = []
    for i, leaf in enumerate(leaves):
        if keys.is_array(leaf):
            shape = tuple(int(d) for d in leaf.shape)
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = _random_keys(shape, str(leaf.dtype), seed * 7919 + i)
            else:
                leaf = jax.device_put(_host_array(shape, np.dtype(leaf.dtype), seed * 7919 + i))
        out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)


def _random_keys(shape: tuple[int, ...], dtype_name: str, stream: int) -> jax.Array:
    """Typed PRNG keys (`jax.random.key`) of `shape`, all distinct."""
    impl = codec.key_impl(dtype_name)
    first = jax.random.key(stream % 2**31, impl=impl)
    return jax.random.split(first, math.prod(shape)).reshape(shape)


#: Values in the pool. A prime: no power-of-two shape lines up with its period, so
#: rows and tiles of an array made from it never repeat each other.
POOL_SIZE = 1_048_573


@functools.lru_cache(maxsize=16)
def _pool(dtype_name: str) -> np.ndarray:
    """`POOL_SIZE` standard normal values in `dtype_name`, twice over, so that a window
    of `POOL_SIZE` values starting anywhere in the first half is one slice."""
    base = np.random.default_rng(20261125).standard_normal(POOL_SIZE, dtype=np.float32)
    base = base.astype(np.dtype(dtype_name))
    return np.concatenate([base, base])


def _host_array(shape: tuple[int, ...], dtype: np.dtype, stream: int) -> np.ndarray:
    """An array of `shape`: the pool read from an offset that depends on `stream`, as
    often over as it takes (a fresh copy: nothing made from it aliases the pool)."""
    n = math.prod(shape)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return np.zeros(shape, dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        real = _host_array(shape, np.dtype(np.float32), stream)
        imag = _host_array(shape, np.dtype(np.float32), stream + 1)
        return (real + 1j * imag).astype(dtype)
    start = (stream * 2654435761) % POOL_SIZE  # Knuth's multiplicative hash: spread out
    window = _pool(dtype.name)[start : start + POOL_SIZE]
    flat = window[:n].copy() if n <= POOL_SIZE else np.resize(window, n)
    return flat.reshape(shape)


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
    per_set = sum(int(a.size) * codec.array_dtype(a).itemsize for a in arrays)
    if per_set == 0 or 2 * per_set >= min_bytes:
        return [list(arrays)]
    wanted = -(-min_bytes // per_set)  # ceil
    allowed = max(1, 1 + max_bytes // per_set)
    count = max(1, min(wanted, max_sets, allowed))
    sets = [list(arrays)]
    for _ in range(count - 1):
        sets.append([jnp.copy(a) for a in arrays])
    return sets


class LazyArgSets:
    """Argument sets to time with, made on first use (or given): one object the bench
    and its sampler share."""

    def __init__(self, source: list[list[Any]] | Callable[[], list[list[Any]]]) -> None:
        self._source = source
        self._sets: list[list[Any]] | None = source if isinstance(source, list) else None

    def __call__(self) -> list[list[Any]]:
        if self._sets is None:
            self._sets = self._source()  # type: ignore[operator]
        return self._sets
