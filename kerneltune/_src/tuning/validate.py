"""Validation: does a candidate compute the same function as the reference config?

Candidates legitimately differ from the reference by rounding: a different block size
sums in a different order, a different backend may use the matrix units' reduced
precision for float32. So outputs are compared by a norm-based relative error,
‖out − ref‖ / ‖ref‖ per output leaf, against a tolerance chosen by the output's dtype,
not elementwise. A wrong candidate (a missed block, a bad index) is off by far more.
NaN never passes; infinities must sit at the same places with the same sign; integer and
boolean outputs must match exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: Norm-wise relative tolerance by output dtype. Float32 allows for TF32 matrix units
#: (about 3e-4 on random data); the others are a few units of their rounding error.
DEFAULT_RTOL: Mapping[str, float] = {
    "float64": 1e-9,
    "float32": 2e-3,
    "float16": 4e-3,
    "bfloat16": 2e-2,
    "complex128": 1e-9,
    "complex64": 2e-3,
}
#: For 8-bit and smaller floating types.
LOW_PRECISION_RTOL = 1.5e-1


def tolerance(dtype: Any, overrides: float | Mapping[Any, float] | None = None) -> float:
    """The relative tolerance for outputs of `dtype` (0.0 means "must match exactly").

    Args:
      dtype: the output's dtype.
      overrides: one tolerance for every floating dtype, or a mapping from dtype (or
        its name) to tolerance that takes precedence over `DEFAULT_RTOL`.

    Example:
      >>> import jax.numpy as jnp
      >>> tolerance(jnp.float32)
      0.002
      >>> tolerance(jnp.int32)
      0.0
    """
    dt = np.dtype(dtype)
    if not jnp.issubdtype(dt, jnp.inexact):
        return 0.0
    if isinstance(overrides, (int, float)):
        return float(overrides)
    if overrides:
        for key, value in overrides.items():
            if np.dtype(key) == dt:
                return float(value)
    if dt.name in DEFAULT_RTOL:
        return DEFAULT_RTOL[dt.name]
    return LOW_PRECISION_RTOL


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of comparing one output with the reference.

    Attributes:
      ok: within tolerance on every leaf.
      rel_error: the largest per-leaf relative error (inf for NaN or mismatches).
      reason: why it failed, for the candidate's error text.
    """

    ok: bool
    rel_error: float
    reason: str | None = None


def has_nan(tree: Any) -> bool:
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return bool(leaves) and bool(_any_nan(leaves))


@jax.jit
def _any_nan(leaves: list[jax.Array]) -> jax.Array:
    return jnp.any(jnp.stack([jnp.any(jnp.isnan(x)) for x in leaves]))


def compare(
    out: Any, ref: Any, rtol: float | Mapping[Any, float] | None = None, *, check_nan: bool = True
) -> Verdict:
    """Compares a candidate's output pytree with the reference output pytree.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.random.normal(jax.random.PRNGKey(0), (64, 512))
      >>> plain = jnp.sum(x, axis=1)
      >>> blocked = jnp.sum(x.reshape(64, 8, 64).sum(axis=2), axis=1)
      >>> compare(blocked, plain).ok
      True
      >>> compare(plain.at[0].add(1.0), plain).ok
      False
    """
    out_leaves, out_tree = jax.tree_util.tree_flatten(out)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(ref)
    if out_tree != ref_tree:  # type: ignore[operator]
        return Verdict(False, math.inf, f"output structure {out_tree} differs from {ref_tree}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(out_leaves, ref_leaves)):
        a, b = jnp.asarray(a), jnp.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return Verdict(
                False,
                math.inf,
                f"output {i} is {a.dtype}{list(a.shape)}, the reference {b.dtype}{list(b.shape)}",
            )
        if a.size == 0:
            continue
        tol = tolerance(a.dtype, rtol)
        if tol == 0.0:
            mismatches = int(_count_unequal(a, b))
            if mismatches:
                return Verdict(False, math.inf, f"output {i}: {mismatches} elements differ")
            continue
        err, nan_out, nan_ref, inf_mismatch = (float(v) for v in _float_stats(a, b))
        if check_nan and nan_out:
            return Verdict(False, math.inf, f"output {i} contains NaN")
        if nan_ref and not nan_out:
            # A NaN-free output cannot be judged against a NaN reference.
            return Verdict(False, math.inf, f"the reference's output {i} contains NaN")
        if inf_mismatch:
            return Verdict(False, math.inf, f"output {i}: infinities differ from the reference")
        worst = max(worst, err)
        if not err <= tol:
            return Verdict(
                False, err, f"output {i}: relative error {err:.3g} exceeds {tol:.3g} ({a.dtype})"
            )
    return Verdict(True, worst)


@jax.jit
def _count_unequal(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.sum(a != b)


@jax.jit
def _float_stats(a: jax.Array, b: jax.Array) -> tuple[jax.Array, ...]:
    # Explicit working types: strict dtype promotion has no bf16/f32 path.
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        work = jnp.complex128 if a.dtype == jnp.complex128 else jnp.complex64
    else:
        work = jnp.float64 if a.dtype == jnp.float64 else jnp.float32
    a, b = a.astype(work), b.astype(work)
    nan_a, nan_b = jnp.any(jnp.isnan(a)), jnp.any(jnp.isnan(b))
    inf_a, inf_b = jnp.isinf(a), jnp.isinf(b)
    inf_mismatch = jnp.any((inf_a | inf_b) & (a != b))
    finite = jnp.isfinite(a) & jnp.isfinite(b)
    diff = jnp.abs(jnp.where(finite, a - b, 0))
    ref = jnp.abs(jnp.where(finite, b, 0))
    # Scale before squaring so large values cannot overflow the sum of squares.
    scale = jnp.maximum(jnp.maximum(jnp.max(diff), jnp.max(ref)), jnp.finfo(diff.dtype).tiny)
    err = jnp.sqrt(jnp.sum(jnp.square(diff / scale)))
    norm = jnp.sqrt(jnp.sum(jnp.square(ref / scale)))
    rel = jnp.where(norm > 0, err / jnp.where(norm > 0, norm, 1), jnp.where(err > 0, jnp.inf, 0))
    return rel, nan_a, nan_b, inf_mismatch
