"""Validation: reassociation passes, wrong values and NaN do not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kerneltune._src.tuning import validate
from tests.helpers import rand


@pytest.mark.parametrize("block", [8, 64, 512])
def test_blocked_float32_sum_matches_a_plain_one(block):
    x = rand((32, 4096), seed=0)
    plain = jnp.sum(x, axis=1)
    blocked = jnp.sum(x.reshape(32, -1, block).sum(axis=2), axis=1)
    sequential = jax.lax.fori_loop(
        0, 4096, lambda i, acc: acc + x[:, i], jnp.zeros(32, jnp.float32)
    )
    for candidate in (blocked, sequential):
        verdict = validate.compare(candidate, plain)
        assert verdict.ok, verdict
        assert 0 <= verdict.rel_error < 1e-5


def test_blocked_bf16_matmul_with_f32_accumulation_passes():
    a, b = rand((128, 512), jnp.bfloat16, seed=1), rand((512, 128), jnp.bfloat16, seed=2)
    plain = jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
    parts = [
        jnp.dot(a[:, i : i + 64], b[i : i + 64], preferred_element_type=jnp.float32)
        for i in range(0, 512, 64)
    ]
    blocked = sum(parts[1:], parts[0]).astype(jnp.bfloat16)
    assert validate.compare(blocked, plain).ok


def test_wrong_values_fail():
    x = rand((64, 64), seed=3)
    ref = x @ x
    assert not validate.compare(ref.at[:, 0].set(0.0), ref).ok  # a missed column
    assert not validate.compare(ref * 1.01, ref).ok
    assert not validate.compare(ref.T, ref).ok


def test_nan_never_passes_and_infinities_must_match():
    ref = rand((16,), seed=4)
    assert validate.compare(ref.at[3].set(jnp.nan), ref).reason == "output 0 contains NaN"
    assert not validate.compare(ref, ref.at[3].set(jnp.nan)).ok
    both_nan = ref.at[3].set(jnp.nan)
    assert not validate.compare(both_nan, both_nan).ok
    inf = ref.at[2].set(jnp.inf)
    assert validate.compare(inf, inf).ok
    assert not validate.compare(ref.at[2].set(-jnp.inf), inf).ok


def test_structure_dtype_integer_and_large_values():
    ref = (rand((8,), seed=5), jnp.arange(8))
    assert validate.compare(ref, ref).ok
    assert "differ" in validate.compare((ref[0], ref[1].at[0].set(9)), ref).reason
    assert "structure" in validate.compare(ref[0], ref).reason
    assert "reference" in validate.compare(ref[0].astype(jnp.bfloat16), ref[0]).reason
    big = rand((1024,), seed=6) * 1e30  # squares overflow float32 without scaling
    assert validate.compare(big * (1 + 1e-6), big).ok
    assert validate.compare(jnp.zeros(4), jnp.zeros(4)).ok
    assert not validate.compare(jnp.ones(4), jnp.zeros(4)).ok


def test_tolerances_by_dtype_and_overrides():
    assert (
        validate.tolerance(jnp.bfloat16)
        > validate.tolerance(jnp.float16)
        > validate.tolerance(jnp.float32)
    )
    assert validate.tolerance(jnp.int8) == 0.0
    assert validate.tolerance(jnp.float32, 0.5) == 0.5
    assert validate.tolerance(jnp.float32, {jnp.float32: 1e-6}) == 1e-6
    assert validate.tolerance(jnp.bfloat16, {"float32": 1e-6}) == validate.DEFAULT_RTOL["bfloat16"]
    assert (
        validate.tolerance(
            np.dtype("float8_e4m3fn") if hasattr(np, "float8_e4m3fn") else jnp.float8_e4m3fn
        )
        == validate.LOW_PRECISION_RTOL
    )
    ref = rand((64,), seed=7)
    assert not validate.compare(ref * 1.01, ref).ok
    assert validate.compare(ref * 1.01, ref, rtol=0.05).ok
