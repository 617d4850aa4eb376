"""The public ops' argument handling dispatches nothing an eager call does not need.

Each JAX op run eagerly is a dispatch of about 10 us on a CPU: `jnp.asarray` of an array,
a reshape to the shape it has, an `astype` to its own dtype, and a missing parameter's
identity built anew made a small eager `layer_norm` cost 135 us (plain JAX's jitted norm:
6 us) and the loss head 87 us (`benchmarks/dispatch_overhead.py`).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune.kernels as kt
from kerneltune.kernels import (
    _args,
    gated_linear_unit,
    layer_norm,
    linear_softmax_cross_entropy,
    ragged_dot,
    rms_norm,
)


def test_an_array_argument_is_taken_as_it_is():
    x = jnp.ones((4, 8))
    assert _args.as_array("op", "x", x) is x
    assert isinstance(_args.as_array("op", "x", np.ones(3)), jax.Array)


def test_rows_and_casts_that_change_nothing_return_their_input():
    x = jnp.ones((4, 8), jnp.float32)
    assert _args.last_axis_rows(x) is x
    rows, back = _args.to_rows(x, (1,))
    assert rows is x and back(rows) is x
    assert _args.cast(x, jnp.float32) is x
    assert _args.cast(x, jnp.bfloat16).dtype == jnp.bfloat16
    # A weakly typed array is cast: astype makes its type strong, as before.
    weak = jnp.full((3,), 0.5)
    assert jax.typeof(weak).weak_type
    assert not jax.typeof(_args.cast(weak, weak.dtype)).weak_type
    assert _args.last_axis_rows(jnp.ones((2, 3, 4))).shape == (6, 4)


@pytest.fixture
def reshape_refused(monkeypatch):
    """Makes every eager `Array.reshape` fail: a reshape to the shape an array already
    has returns it, but still costs about 8 us of shape arithmetic a call (an eager
    `layer_norm` with a scale and a bias took 36 us, 20 without its two)."""
    array_type = type(jnp.ones(1))

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"eager reshape of {self.shape} to {args or kwargs}")

    monkeypatch.setattr(array_type, "reshape", refuse)


def test_one_dimensional_norm_parameters_are_taken_without_a_reshape(reshape_refused):
    x = jax.random.normal(jax.random.PRNGKey(3), (4, 16), jnp.float32)
    scale = jnp.full((16,), 2.0, jnp.float32)
    bias = jnp.full((16,), 0.5, jnp.float32)
    assert _args.feature_param("op", "scale", scale, x, (1,)) is scale
    np.testing.assert_allclose(layer_norm(x, scale, bias), 2.0 * layer_norm(x) + 0.5, atol=1e-5)
    np.testing.assert_allclose(rms_norm(x, scale), 2.0 * rms_norm(x), atol=1e-5)


def test_an_eager_two_dimensional_gated_linear_unit_is_not_reshaped(reshape_refused):
    key = jax.random.split(jax.random.PRNGKey(4), 2)
    x = jax.random.normal(key[0], (8, 16), jnp.float32)
    w = jax.random.normal(key[1], (16, 2, 8), jnp.float32)
    out = gated_linear_unit(x, w)
    want = jax.nn.silu(x @ w[:, 0]) * (x @ w[:, 1])
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_int32_group_sizes_reach_the_grouped_matmul_without_a_cast(monkeypatch):
    key = jax.random.split(jax.random.PRNGKey(5), 2)
    x = jax.random.normal(key[0], (12, 8), jnp.float32)
    w = jax.random.normal(key[1], (3, 8, 4), jnp.float32)
    sizes = jnp.array([5, 0, 7], jnp.int32)
    want = jax.lax.ragged_dot(x, w, sizes)

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"eager astype of {self.dtype} to {args or kwargs}")

    monkeypatch.setattr(type(sizes), "astype", refuse)
    np.testing.assert_allclose(ragged_dot(x, w, sizes), want, rtol=2e-5, atol=2e-5)


def test_a_missing_parameters_identity_is_built_once_for_eager_calls_only():
    a = _args.full(8, 1.0, jnp.float32, concrete=True)
    assert a is _args.full(8, 1.0, jnp.float32, concrete=True)
    assert a is not _args.full(8, 0.0, jnp.float32, concrete=True)
    np.testing.assert_array_equal(a, np.ones(8, np.float32))
    seen = []

    @jax.jit
    def traced(x):
        seen.append(_args.full(8, 1.0, jnp.float32, concrete=False))
        return x

    traced(jnp.ones(2))
    assert isinstance(seen[0], jax.core.Tracer)  # built in the program, not captured


@pytest.mark.parametrize("norm", [layer_norm, rms_norm])
def test_eager_norms_without_parameters_reuse_their_identity_and_match_under_jit(norm):
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 16), jnp.float32)
    _args._concrete_full.cache_clear()
    eager = norm(x)
    misses = _args._concrete_full.cache_info().misses
    norm(x)
    assert _args._concrete_full.cache_info().misses == misses  # the second call built none
    np.testing.assert_allclose(eager, jax.jit(norm)(x), rtol=1e-6, atol=1e-6)


def test_the_eager_loss_heads_default_mask_is_built_once():
    key = jax.random.split(jax.random.PRNGKey(1), 2)
    x = jax.random.normal(key[0], (8, 16), jnp.float32)
    w = jax.random.normal(key[1], (16, 32), jnp.float32)
    labels = jnp.arange(8, dtype=jnp.int32)
    _args._concrete_full.cache_clear()
    eager = linear_softmax_cross_entropy(x, labels, w)
    assert _args._concrete_full.cache_info().currsize == 1
    linear_softmax_cross_entropy(x, labels, w)
    assert _args._concrete_full.cache_info().hits >= 1
    traced = jax.jit(linear_softmax_cross_entropy)(x, labels, w)
    np.testing.assert_allclose(eager, traced, rtol=1e-6)


@pytest.fixture
def eager_binds(monkeypatch):
    """Counts the primitives JAX runs eagerly (outside any trace), by name."""
    from jax._src import core

    if not hasattr(core.EvalTrace, "process_primitive"):
        pytest.skip("this JAX runs eager primitives another way")
    seen: dict[str, int] = {}
    run = core.EvalTrace.process_primitive

    def counting(self, primitive, *args, **params):
        seen[primitive.name] = seen.get(primitive.name, 0) + 1
        return run(self, primitive, *args, **params)

    monkeypatch.setattr(core.EvalTrace, "process_primitive", counting)
    return seen


def test_eager_two_dimensional_calls_of_every_op_run_no_eager_primitive(eager_binds):
    key = jax.random.split(jax.random.PRNGKey(6), 4)
    x = jax.random.normal(key[0], (8, 32), jnp.float32)
    w = jax.random.normal(key[1], (32, 32), jnp.float32)
    w_glu = jax.random.normal(key[2], (32, 2, 16), jnp.float32)
    w_experts = jax.random.normal(key[3], (3, 32, 16), jnp.float32)
    scale = jnp.full((32,), 2.0, jnp.float32)
    bias = jnp.full((32,), 0.5, jnp.float32)
    sizes = jnp.array([3, 0, 5], jnp.int32)
    labels = jnp.arange(8, dtype=jnp.int32)
    q = jax.random.normal(key[0], (1, 8, 2, 16), jnp.float32)
    calls = {
        "softmax": lambda: kt.softmax(x),
        "layer_norm": lambda: layer_norm(x, scale, bias),
        "layer_norm without parameters": lambda: layer_norm(x),
        "rms_norm": lambda: rms_norm(x, scale),
        "matmul": lambda: kt.matmul(x, w),
        "gated_linear_unit": lambda: gated_linear_unit(x, w_glu),
        "ragged_dot": lambda: ragged_dot(x, w_experts, sizes),
        "attention": lambda: kt.attention(q, q, q, is_causal=True),
        "linear_softmax_cross_entropy": lambda: linear_softmax_cross_entropy(x, labels, w),
    }
    ran = {}
    for name, call in calls.items():
        jax.block_until_ready(call())  # the first call compiles and may build constants
        eager_binds.clear()
        jax.block_until_ready(call())
        ran[name] = dict(eager_binds)
    assert ran == {name: {} for name in calls}


def test_eager_calls_over_more_dimensions_reshape_in_a_program(eager_binds):
    """A `[B, T, D]` call's reshapes to rows and back run as one jitted program each: as
    eager primitives they took 40 of an eager `layer_norm`'s 61 µs on a CPU."""
    key = jax.random.split(jax.random.PRNGKey(7), 3)
    x = jax.random.normal(key[0], (2, 3, 32), jnp.float32)
    w = jax.random.normal(key[1], (32, 16), jnp.float32)
    w_glu = jax.random.normal(key[2], (32, 2, 16), jnp.float32)
    scale = jnp.full((32,), 2.0, jnp.float32)
    calls = {
        "softmax": (lambda: kt.softmax(x), lambda: jax.nn.softmax(x)),
        "layer_norm": (lambda: layer_norm(x, scale), lambda: 2.0 * layer_norm(x)),
        "rms_norm": (lambda: rms_norm(x, scale), lambda: 2.0 * rms_norm(x)),
        "matmul": (lambda: kt.matmul(x, w), lambda: x @ w),
        "gated_linear_unit": (
            lambda: gated_linear_unit(x, w_glu),
            lambda: jax.nn.silu(x @ w_glu[:, 0]) * (x @ w_glu[:, 1]),
        ),
    }
    ran = {}
    for name, (call, want) in calls.items():
        expected = want()
        jax.block_until_ready(call())
        eager_binds.clear()
        out = jax.block_until_ready(call())
        ran[name] = dict(eager_binds)
        assert out.shape == x.shape[:-1] + expected.shape[-1:]
        np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5, err_msg=name)
    assert ran == {name: {} for name in calls}


def test_a_traced_reshape_is_the_plain_reshape_with_no_nested_program():
    x = jnp.ones((2, 3, 4))
    assert _args.reshape(x, (2, 3, 4)) is x
    eqns = jax.make_jaxpr(lambda v: _args.reshape(v, (6, 4)))(x).jaxpr.eqns
    assert [e.primitive.name for e in eqns] == ["reshape"]
    np.testing.assert_array_equal(_args.reshape(jnp.arange(6), (2, 3)), np.arange(6).reshape(2, 3))


def test_eager_casts_and_moved_axes_run_in_a_program(eager_binds):
    """bfloat16 activations with float32 parameters, and a norm over another axis than
    the last: their casts and transposes run as one jitted program each."""
    key = jax.random.split(jax.random.PRNGKey(8), 3)
    x = jax.random.normal(key[0], (8, 32), jnp.float32)
    xb = x.astype(jnp.bfloat16)
    x3 = jax.random.normal(key[1], (4, 16, 8), jnp.float32)
    scale = jnp.full((32,), 2.0, jnp.float32)
    w_glu = jax.random.normal(key[2], (32, 2, 16), jnp.float32)
    w = jax.random.normal(key[2], (32, 24), jnp.float32)
    labels = jnp.arange(8, dtype=jnp.int32)
    calls = {
        "layer_norm, bf16 x, f32 scale": (
            lambda: layer_norm(xb, scale),
            lambda: 2.0 * layer_norm(xb.astype(jnp.float32)),
        ),
        "layer_norm over axis 1": (
            lambda: layer_norm(x3, axis=1),
            lambda: jnp.moveaxis(layer_norm(jnp.moveaxis(x3, 1, -1)), -1, 1),
        ),
        "softmax over axis 1": (lambda: kt.softmax(x3, axis=1), lambda: jax.nn.softmax(x3, 1)),
        "gated_linear_unit, bf16 x, f32 w": (
            lambda: gated_linear_unit(xb, w_glu),
            # computed in float32, returned in x's dtype (as tokamax's)
            lambda: gated_linear_unit(xb.astype(jnp.float32), w_glu).astype(jnp.bfloat16),
        ),
        "loss head, bf16 x, f32 w": (
            lambda: linear_softmax_cross_entropy(xb, labels, w),
            lambda: linear_softmax_cross_entropy(xb.astype(jnp.float32), labels, w),
        ),
    }
    ran = {}
    for name, (call, want) in calls.items():
        with jax.numpy_dtype_promotion("standard"):  # mixed dtypes promote, as in flax
            expected = want()
            jax.block_until_ready(call())
            eager_binds.clear()
            out = jax.block_until_ready(call())
        ran[name] = dict(eager_binds)
        assert out.dtype == expected.dtype, name
        tol = 2e-5 if out.dtype == jnp.float32 else 2e-2
        np.testing.assert_allclose(
            np.asarray(out, np.float32),
            np.asarray(expected, np.float32),
            rtol=tol,
            atol=tol,
            err_msg=name,
        )
    assert ran == {name: {} for name in calls}
