"""The bundled ops under `jax.export` with polymorphic shapes: exported with a symbolic
token count, serialized, read back and called at two lengths, they give what the op
gives on those arrays (tokamax's API tests export its norm this way)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from kerneltune.kernels import (
    gated_linear_unit,
    layer_norm,
    linear_softmax_cross_entropy,
    ragged_dot,
    rms_norm,
)
from kerneltune.kernels._args import symbolic
from kerneltune.kernels._common import relative_error, tolerance
from tests.helpers import heuristics_executor, normal

EX = heuristics_executor()
F32 = jnp.float32
K, N, V = 16, 8, 24


def _rows(rng, t, dtype):
    return normal(rng, (t, K), dtype)


#: name -> (function of the token count's arrays, arrays for `t` tokens, their
#: abstract shapes with the token count `a`).
CASES = {
    "layer_norm": (
        lambda x, s, b: layer_norm(x, s, b, executor=EX),
        lambda rng, t, d: (_rows(rng, t, d), normal(rng, (K,), d), normal(rng, (K,), d)),
        lambda a, d: ((a, K), (K,), (K,)),
    ),
    "layer_norm-3d-two-axes": (
        lambda x: layer_norm(x, axis=(1, 2), executor=EX),
        lambda rng, t, d: (normal(rng, (t, 4, 4), d),),
        lambda a, d: ((a, 4, 4),),
    ),
    "rms_norm": (
        lambda x, s: rms_norm(x, s, executor=EX),
        lambda rng, t, d: (_rows(rng, t, d), normal(rng, (K,), d)),
        lambda a, d: ((a, K), (K,)),
    ),
    "gated_linear_unit": (
        lambda x, w: gated_linear_unit(x, w, executor=EX),
        lambda rng, t, d: (_rows(rng, t, d), normal(rng, (K, 2, N), d, scale=0.25)),
        lambda a, d: ((a, K), (K, 2, N)),
    ),
    "ragged_dot": (
        lambda x, w, s: ragged_dot(x, w, s, executor=EX),
        lambda rng, t, d: (
            _rows(rng, t, d),
            normal(rng, (3, K, N), d),
            jnp.array([2, 0, t - 3], jnp.int32),
        ),
        lambda a, d: ((a, K), (3, K, N), (3,)),
    ),
    "linear_softmax_cross_entropy": (
        lambda x, labels, w: linear_softmax_cross_entropy(x, labels, w, executor=EX),
        lambda rng, t, d: (
            _rows(rng, t, d),
            jnp.asarray(rng.integers(0, V, t), jnp.int32),
            normal(rng, (K, V), d, scale=0.25),
        ),
        lambda a, d: ((a, K), (a,), (K, V)),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_op_exported_with_a_symbolic_token_count_runs_at_any_count(name):
    fn, make, shapes = CASES[name]
    rng = np.random.default_rng(3)
    example = make(rng, 7, F32)
    (a,) = export.symbolic_shape("a")
    specs = [jax.ShapeDtypeStruct(s, e.dtype) for s, e in zip(shapes(a, F32), example, strict=True)]
    exported = export.deserialize(export.export(jax.jit(fn))(*specs).serialize())
    for t in (7, 12):
        args = make(rng, t, F32)
        got, want = exported.call(*args), fn(*args)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert relative_error(got, want) <= tolerance(F32)


def test_the_gradient_of_an_exported_norm_is_the_norms():
    # tokamax's API test exports `value_and_grad` of a layer norm over [a, 32].
    def loss(x, s, b):
        return jnp.sum(jnp.sin(layer_norm(x, s, b, executor=EX)))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    (a,) = export.symbolic_shape("a")
    specs = [jax.ShapeDtypeStruct(s, F32) for s in ((a, 32), (32,), (32,))]
    exported = export.deserialize(export.export(grad)(*specs).serialize())
    rng = np.random.default_rng(4)
    args = (normal(rng, (9, 32)), normal(rng, (32,)), normal(rng, (32,)))
    for got, want in zip(jax.tree.leaves(exported.call(*args)), jax.tree.leaves(grad(*args))):
        assert relative_error(got, want) <= tolerance(F32)


def test_symbolic_tells_polymorphic_shapes_from_concrete_ones():
    (a,) = export.symbolic_shape("a")
    assert symbolic(jax.ShapeDtypeStruct((a, 4), F32))
    assert not symbolic(jnp.ones((3, 4)), np.ones(2))
