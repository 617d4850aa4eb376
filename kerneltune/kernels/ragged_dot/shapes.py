"""Grouped-matmul shapes `(m, k, n, g)` and routings shared by the tests, the demo and
the GPU benchmark."""

from __future__ import annotations

import numpy as np

#: Small shapes for CPU tests (Pallas interpreter): aligned, uneven, one expert.
TEST_SHAPES = ((64, 32, 32, 4), (50, 24, 40, 3), (32, 16, 16, 1))
#: The GPU benchmark: 64 fine-grained experts (32768 routed rows × 2048 → 1408) and
#: Mixtral-like 8 experts (16384 × 4096 → 14336).
BENCH_SHAPES = ((32768, 2048, 1408, 64), (16384, 4096, 14336, 8))
#: Every code path of the benchmark once, on any device.
SMOKE_SHAPES = ((64, 32, 32, 4),)


def balanced(m: int, g: int) -> np.ndarray:
    """`m` rows split as evenly as possible over `g` groups (the first `m % g` get one
    more): the routing kerneltune tunes with.

    Example:
      >>> balanced(10, 4).tolist()
      [3, 3, 2, 2]
    """
    sizes = np.full(g, m // g, np.int32)
    sizes[: m % g] += 1
    return sizes


def skewed(m: int, g: int, *, seed: int = 0, empty: int = 0) -> np.ndarray:
    """`m` rows over `g` groups with Zipf-like popularity (a few experts get most of
    the tokens), the last `empty` groups getting none; sums to `m`.

    Example:
      >>> s = skewed(1000, 8, empty=2)
      >>> int(s.sum()), s[-2:].tolist(), bool(s.max() > 3 * s[:6].min())
      (1000, [0, 0], True)
    """
    live = g - empty
    if live <= 0:
        raise ValueError(f"skewed: empty={empty} must leave at least one of the {g} groups.")
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, live + 1) ** 1.1
    rng.shuffle(weights)
    sizes = np.floor(weights / weights.sum() * m).astype(np.int32)
    sizes[np.argmax(sizes)] += m - int(sizes.sum())
    return np.concatenate([sizes, np.zeros(empty, np.int32)])
