"""The bundled ops compute what JAX computes, for every valid input (issue 11).

Hypothesis draws shapes, dtypes, axes and feature combinations; every op's value and
gradients are compared with `jax.nn` / `jnp` (or, for what JAX lacks, an independent
float64 NumPy reference) on fresh random inputs, through the tuned path (the XLA
backend on CPU) and through the Pallas interpreter where the op has one.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kerneltune._src.core import options
from kerneltune.kernels import (
    attention,
    gated_linear_unit,
    layer_norm,
    linear_softmax_cross_entropy,
    matmul,
    ragged_dot,
    rms_norm,
    softmax,
)
from kerneltune.kernels.attention import AttentionInterpret
from kerneltune.kernels.normalization import LayerNormInterpret
from tests.helpers import close, heuristics_executor, rand

SETTINGS = settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
#: `close`'s tolerance for results in each dtype.
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}


EX = heuristics_executor()


# --- norms -------------------------------------------------------------------------


def flax_layer_norm(x, scale, bias, axes, eps):
    """flax.nnx.LayerNorm's math, in the result dtype."""
    dtype = jnp.result_type(x, *(p for p in (scale, bias) if p is not None))
    xf = x.astype(jnp.float32)
    mean = xf.mean(axes, keepdims=True)
    var = jnp.square(xf - mean).mean(axes, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    shape = [x.shape[a] if a in axes else 1 for a in range(x.ndim)]
    if scale is not None:
        y = y * scale.astype(jnp.float32).reshape(shape)
    if bias is not None:
        y = y + bias.astype(jnp.float32).reshape(shape)
    return y.astype(dtype)


def flax_rms_norm(x, scale, axes, eps):
    dtype = jnp.result_type(x, *(p for p in (scale,) if p is not None))
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.square(xf).mean(axes, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.astype(jnp.float32).reshape(
            [x.shape[a] if a in axes else 1 for a in range(x.ndim)]
        )
    return y.astype(dtype)


@st.composite
def norm_cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    axes = tuple(sorted(draw(st.sets(st.integers(0, ndim - 1), min_size=1, max_size=ndim))))
    axis = axes[0] - ndim if len(axes) == 1 and draw(st.booleans()) else axes
    if len(axes) == 1 and isinstance(axis, tuple):
        axis = axis[0]
    dtype = draw(st.sampled_from([jnp.float32, jnp.bfloat16]))
    with_scale, with_bias = draw(st.booleans()), draw(st.booleans())
    eps = draw(st.sampled_from([1e-6, 1e-5, 0.1]))
    return shape, axes, axis, dtype, with_scale, with_bias, eps, draw(st.integers(0, 2**16))


@SETTINGS
@given(norm_cases())
@jax.numpy_dtype_promotion("standard")  # float32 params with bfloat16 inputs, as in flax
def test_layer_norm_and_rms_norm_match_flax_math_values_and_gradients(case):
    shape, axes, axis, dtype, with_scale, with_bias, eps, seed = case
    x = rand(shape, dtype, seed=seed)
    feat = tuple(shape[a] for a in axes)
    scale = rand(feat, seed=seed + 1) if with_scale else None  # float32 params, as flax keeps them
    bias = rand(feat, seed=seed + 2) if with_bias else None
    got = layer_norm(x, scale, bias, axis=axis, epsilon=eps, executor=EX)
    # The references compiled whole (op by op, each primitive compiles alone per shape).
    want = jax.jit(lambda x, s, b: flax_layer_norm(x, s, b, axes, eps))(x, scale, bias)
    assert got.dtype == want.dtype
    close(got, want, tol=TOL[dtype])
    close(
        rms_norm(x, scale, axis=axis, epsilon=eps, executor=EX),
        jax.jit(lambda x, s: flax_rms_norm(x, s, axes, eps))(x, scale),
        tol=TOL[dtype],
    )
    if dtype == jnp.float32 and scale is not None and bias is not None:
        w = rand(shape, seed=seed + 3)

        def loss(fn):
            return lambda x, s, b: (fn(x, s, b) * w).sum()

        ours = jax.grad(
            loss(lambda x, s, b: layer_norm(x, s, b, axis=axis, epsilon=eps, executor=EX)),
            (0, 1, 2),
        )
        ref = jax.jit(
            jax.grad(loss(lambda x, s, b: flax_layer_norm(x, s, b, axes, eps)), (0, 1, 2))
        )
        for g, r in zip(ours(x, scale, bias), ref(x, scale, bias)):
            close(g, r, tol=TOL[jnp.float32])


def test_the_pallas_norm_in_the_interpreter_matches_flax():
    x, s, b = rand((6, 32), seed=0), rand((32,), seed=1), rand((32,), seed=2)
    kernel = LayerNormInterpret()
    got = EX(kernel, x, s, b, eps=1e-6)
    ref = jax.jit(lambda x, s, b: flax_layer_norm(x, s, b, (1,), 1e-6))  # compiled whole
    close(got, ref(x, s, b), tol=TOL[jnp.float32])
    grads = jax.grad(lambda x, s, b: (EX(kernel, x, s, b, eps=1e-6) ** 2).sum(), (0, 1, 2))(x, s, b)
    want = jax.jit(
        jax.grad(lambda x, s, b: (flax_layer_norm(x, s, b, (1,), 1e-6) ** 2).sum(), (0, 1, 2))
    )(x, s, b)
    for g, r in zip(grads, want):
        close(g, r, tol=TOL[jnp.float32])


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: layer_norm(jnp.ones((2, 3)), jnp.ones(4)),
            r"scale must have the shape .*\(3,\).*\(4,\)",
        ),
        (lambda: layer_norm(jnp.ones((2, 3)), axis=2), r"axis 2 is out of range .* -2\.\.1"),
        (lambda: rms_norm(jnp.ones((2, 3)), axis=(1, -1)), "names an axis twice"),
        (lambda: rms_norm(jnp.ones((2, 3), jnp.int32)), "floating dtype, got int32"),
        (lambda: rms_norm(jnp.ones(3), epsilon=-1.0), "epsilon must be >= 0"),
        (lambda: layer_norm("x"), "x must be an array"),
    ],
)
def test_norms_name_the_bad_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda s: matmul(s((2, 3)), jnp.ones((3, 4))), "matmul: a must be an array"),
        (lambda s: softmax(s((2, 3))), "softmax: x must be an array"),
        (lambda s: attention(*(s((1, 16, 2, 8)),) * 3), "attention: query must be an array"),
    ],
)
def test_a_shape_dtype_struct_is_refused_naming_the_argument(call, match):
    # Before: "float() argument must be a string or a real number, not
    # 'ShapeDtypeStruct'", from deep in JAX; jnp.matmul names the argument.
    with pytest.raises(TypeError, match=match + ".*ShapeDtypeStruct.*jax.eval_shape"):
        call(lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32))


def test_float64_norms_and_softmax_keep_float64_precision():
    # Before: the statistics and the softmax were computed in float32 and cast back, so
    # under x64 a layer norm of values near 1 was off by 1e-4 (flax and jax.nn compute
    # in float64 there).
    with jax.enable_x64(True):
        x = 1.0 + 1e-3 * np.random.default_rng(7).standard_normal((3, 8))
        scale = np.random.default_rng(8).standard_normal(8)
        centred = x - x.mean(-1, keepdims=True)
        ln = centred / np.sqrt(np.square(centred).mean(-1, keepdims=True) + 1e-6) * scale
        rms = x / np.sqrt(np.square(x).mean(-1, keepdims=True) + 1e-6) * scale
        sm = np.exp(1e3 * x - (1e3 * x).max(-1, keepdims=True))
        sm /= sm.sum(-1, keepdims=True)
        for got, want in [
            (layer_norm(jnp.asarray(x), jnp.asarray(scale), executor=EX), ln),
            (rms_norm(jnp.asarray(x), jnp.asarray(scale), executor=EX), rms),
            (softmax(jnp.asarray(1e3 * x), executor=EX), sm),
        ]:
            assert got.dtype == jnp.float64
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-9, atol=1e-9)
        w = jnp.asarray(np.random.default_rng(9).standard_normal((3, 8)))
        for ours, theirs in [
            (lambda x: softmax(x, executor=EX), lambda x: jax.nn.softmax(x)),
            (lambda x: layer_norm(x, executor=EX), lambda x: jax.nn.standardize(x, epsilon=1e-6)),
        ]:
            g = jax.grad(lambda x, f=ours: (f(x) * w).sum())(jnp.asarray(x))
            assert g.dtype == jnp.float64
            want_g = jax.grad(lambda x, f=theirs: (f(x) * w).sum())(jnp.asarray(x))
            np.testing.assert_allclose(np.asarray(g), np.asarray(want_g), rtol=1e-6, atol=1e-6)


# --- softmax -------------------------------------------------------------------------


@SETTINGS
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=3),
    st.integers(0, 2),
    st.booleans(),
    st.sampled_from([jnp.float32, jnp.bfloat16]),
    st.integers(0, 2**16),
)
def test_softmax_matches_jax_nn_with_axes_and_where(shape, axis_pick, use_where, dtype, seed):
    x = rand(tuple(shape), dtype, seed=seed)
    axis = axis_pick % len(shape)
    # Drawn by NumPy, as `rand` draws: JAX's generator compiles a program for every shape.
    where = (
        jnp.asarray(np.random.default_rng(seed + 1).random(x.shape) < 0.7) if use_where else None
    )
    close(
        softmax(x, axis, where, executor=EX),
        # The references compiled whole (op by op, each primitive compiles alone per shape).
        jax.jit(lambda x, w: jax.nn.softmax(x, axis=axis, where=w))(x, where),
        tol=TOL[dtype],
    )
    if len(shape) >= 2:
        want = jax.jit(lambda x: jax.nn.softmax(x, axis=(0, 1)))(x)
        close(softmax(x, (0, 1), executor=EX), want, tol=TOL[dtype])
    if dtype == jnp.float32 and not use_where:
        w = rand(x.shape, seed=seed + 2)
        g = jax.grad(lambda x: (softmax(x, axis, executor=EX) * w).sum())(x)
        close(
            g,
            jax.jit(jax.grad(lambda x: (jax.nn.softmax(x, axis=axis) * w).sum()))(x),
            tol=TOL[jnp.float32],
        )


def test_softmax_takes_every_axis_and_integer_inputs_as_jax_nn_does():
    # Before: axis=None raised "'NoneType' object is not iterable" and an int32 array
    # "x must have a floating dtype"; jax.nn.softmax normalises over every axis, and
    # promotes integers to float.
    x = rand((3, 4), seed=5)
    close(softmax(x, axis=None, executor=EX), jax.nn.softmax(x, axis=None), tol=2e-5)
    ints = jnp.arange(12, dtype=jnp.int32).reshape(3, 4) % 5
    for axis in (-1, 0, None):
        got, want = softmax(ints, axis, executor=EX), jax.nn.softmax(ints, axis=axis)
        assert got.dtype == want.dtype == jnp.float32
        close(got, want, tol=2e-5)
    with pytest.raises(ValueError, match="where must broadcast"):
        softmax(ints, where=jnp.ones((2, 4), bool), executor=EX)


def test_softmax_takes_a_numpy_integer_axis_as_jax_nn_does():
    # Before: `axis=np.int64(1)` raised "The truth value of an empty array is
    # ambiguous" (the axis was compared with `()`); jax.nn.softmax takes it.
    x = rand((3, 4, 5), seed=6)
    for axis in (np.int64(1), np.int32(-1)):
        close(softmax(x, axis, executor=EX), jax.nn.softmax(x, axis=int(axis)), tol=2e-5)


# --- matmul --------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((5,), (5,)),
    ((3, 5), (5,)),
    ((5,), (5, 4)),
    ((3, 5), (5, 4)),
    ((2, 3, 5), (5, 4)),
    ((2, 3, 5), (2, 5, 4)),
    ((2, 1, 3, 5), (4, 5, 6)),
]


@SETTINGS
@given(
    st.sampled_from(MATMUL_SHAPES),
    st.sampled_from(
        [(jnp.float32, jnp.float32), (jnp.bfloat16, jnp.float32), (jnp.bfloat16, jnp.bfloat16)]
    ),
    st.integers(0, 2**16),
)
@jax.numpy_dtype_promotion("standard")  # bf16 @ f32 promotes, as users' JAX does
def test_matmul_matches_jnp_matmul_shapes_promotion_and_gradients(shapes, dtypes, seed):
    a, b = rand(shapes[0], dtypes[0], seed=seed), rand(shapes[1], dtypes[1], seed=seed + 1)
    got, want = matmul(a, b, executor=EX), jnp.matmul(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    close(got, want, tol=TOL[jnp.bfloat16 if jnp.bfloat16 in dtypes else jnp.float32])
    if dtypes == (jnp.float32, jnp.float32):
        ga = jax.grad(lambda a, b: (matmul(a, b, executor=EX) ** 2).sum(), (0, 1))(a, b)
        gb = jax.jit(jax.grad(lambda a, b: (jnp.matmul(a, b) ** 2).sum(), (0, 1)))(a, b)
        for g, r in zip(ga, gb):
            close(g, r, tol=TOL[jnp.float32])


def test_matmul_int8_and_preferred_element_type_follow_jnp():
    a = jax.random.randint(jax.random.key(0), (4, 8), -100, 100, jnp.int8)
    b = jax.random.randint(jax.random.key(1), (8, 3), -100, 100, jnp.int8)
    got = matmul(a, b, preferred_element_type=jnp.int32, executor=EX)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, jnp.matmul(a, b, preferred_element_type=jnp.int32))
    np.testing.assert_array_equal(matmul(a, b, executor=EX), jnp.matmul(a, b))


@pytest.mark.parametrize("a_shape", [(2, 3), (2, 2, 3)])
def test_a_matmul_of_two_weakly_typed_operands_is_weakly_typed_as_in_jnp(a_shape):
    # Before: the kernel's product of two weakly typed arrays (`jnp.full(s, 0.5)`) was
    # strongly typed float32, so adding a bfloat16 array gave float32 where
    # jnp.matmul's product gives bfloat16.
    a, b = jnp.full(a_shape, 0.5), jnp.full((3, 4), 2.0)
    got, want = matmul(a, b, executor=EX), jnp.matmul(a, b)
    assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type) == (jnp.float32, True)
    np.testing.assert_array_equal(got, want)
    assert (got + jnp.ones((), jnp.bfloat16)).dtype == jnp.bfloat16


def test_a_float64_matmul_keeps_float64_precision():
    # Before: the CPU path accumulated a float64 product in float32 and cast it back
    # (an error of 5e-8 where jnp.matmul's is 1e-16).
    with jax.enable_x64(True):
        rng = np.random.default_rng(3)
        a, b = rng.standard_normal((2, 4, 6)), rng.standard_normal((6, 3))
        for x in (a[0], a):  # the kernel's own shape, and rows flattened into it
            got = matmul(jnp.asarray(x), jnp.asarray(b), executor=EX)
            assert got.dtype == jnp.float64
            np.testing.assert_allclose(np.asarray(got), x @ b, rtol=1e-12, atol=1e-12)
        g = jax.grad(lambda x: matmul(x, jnp.asarray(b), executor=EX).sum())(jnp.asarray(a[0]))
        np.testing.assert_allclose(np.asarray(g), np.broadcast_to(b.sum(1), (4, 6)), rtol=1e-12)


def test_matmul_names_mismatched_contracting_dimensions():
    with pytest.raises(
        TypeError, match=r"a's last dimension \(5\) must equal b's second-to-last dimension \(4\)"
    ):
        matmul(jnp.ones((3, 5)), jnp.ones((4, 2)))
    with pytest.raises(ValueError, match="at least one dimension"):
        matmul(jnp.ones(()), jnp.ones(3))


@pytest.mark.parametrize(
    "ours, theirs, shapes",
    [
        (matmul, jnp.matmul, [(3, 0), (0, 2)]),
        (matmul, jnp.matmul, [(2, 3, 0), (0, 2)]),
        (softmax, jax.nn.softmax, [(3, 0)]),
        (layer_norm, lambda x: x, [(2, 0)]),
        (rms_norm, lambda x: x, [(4, 2, 0)]),
        (
            gated_linear_unit,
            lambda x, w: jax.nn.silu(x @ w[:, 0]) * (x @ w[:, 1]),
            [(5, 0), (0, 2, 3)],
        ),
    ],
    ids=["matmul", "matmul_batched", "softmax", "layer_norm", "rms_norm", "glu"],
)
def test_a_zero_sized_feature_or_contracting_axis_gives_what_jax_gives(ours, theirs, shapes):
    # Before: the ops flattened to rows with `reshape((-1, 0))`, and JAX raised
    # ZeroDivisionError; jnp.matmul gives zeros, jax.nn.softmax an empty array.
    args = [jnp.ones(s) for s in shapes]
    got, want = ours(*args, executor=EX), theirs(*args)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


# --- attention -----------------------------------------------------------------------


def numpy_attention(q, k, v, bias, mask, scale, causal, q_len, kv_len, window, cap):
    """An independent float64 reference (NumPy, one head at a time)."""
    q, k, v = (np.asarray(jnp.asarray(a, jnp.float32), np.float64) for a in (q, k, v))
    b, t, n, h = q.shape
    s, kh = k.shape[1], k.shape[2]
    out = np.zeros((b, t, n, v.shape[-1]))
    bias = None if bias is None else np.broadcast_to(np.asarray(bias, np.float64), (b, n, t, s))
    mask = None if mask is None else np.broadcast_to(np.asarray(mask), (b, n, t, s))
    for bi in range(b):
        for ni in range(n):
            kv = ni // (n // kh)
            logits = q[bi, :, ni] @ k[bi, :, kv].T * scale
            if bias is not None:
                logits = logits + bias[bi, ni]
            if cap is not None:
                logits = cap * np.tanh(logits / cap)
            keep = np.ones((t, s), bool)
            i, j = np.arange(t)[:, None], np.arange(s)[None, :]
            if mask is not None:
                keep &= mask[bi, ni]
            if causal:
                keep &= i >= j
            if window is not None:
                keep &= (i <= j + window[0]) & (i >= j - window[1])
            if q_len is not None:
                keep &= i < q_len[bi]
            if kv_len is not None:
                keep &= j < kv_len[bi]
            logits = np.where(keep, logits, -0.7 * np.finfo(np.float32).max)
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p = p / p.sum(-1, keepdims=True)
            o = p @ v[bi, :, kv]
            if q_len is not None:
                o[q_len[bi] :] = 0
            out[bi, :, ni] = o
    return out


@st.composite
def attention_cases(draw):
    b = draw(st.integers(1, 2))
    t = draw(st.sampled_from([4, 7, 16]))
    s = draw(st.sampled_from([5, 8, 16]))
    kh = draw(st.sampled_from([1, 2]))
    n = kh * draw(st.sampled_from([1, 2]))
    h = draw(st.sampled_from([4, 8]))
    feats = {
        "bias": draw(st.booleans()),
        "mask": draw(st.booleans()),
        "causal": draw(st.booleans()),
        "lengths": draw(st.booleans()),
        "window": draw(st.sampled_from([None, 2, (1, 3)])),
        "cap": draw(st.sampled_from([None, 5.0])),
        "scale": draw(st.sampled_from([None, 0.3])),
        "unbatched": b == 1 and draw(st.booleans()),
    }
    return (b, t, s, n, kh, h), feats, draw(st.integers(0, 2**16))


@settings(SETTINGS, max_examples=8)
@given(attention_cases())
def test_attention_matches_an_independent_reference_with_every_feature(case):
    (b, t, s, n, kh, h), f, seed = case
    q, k, v = (
        rand((b, t, n, h), seed=seed),
        rand((b, s, kh, h), seed=seed + 1),
        rand((b, s, kh, h), seed=seed + 2),
    )
    bias = rand((1, n, t, s), seed=seed + 3) if f["bias"] else None
    mask = (
        jnp.asarray(np.random.default_rng(seed + 4).random((b, 1, t, s)) < 0.8)
        if f["mask"]
        else None
    )
    q_len = jnp.array([t] + [max(1, t - 2)] * (b - 1), jnp.int32) if f["lengths"] else None
    kv_len = jnp.array([max(1, s - 1)] * b, jnp.int32) if f["lengths"] else None
    window = f["window"]
    win_pair = None if window is None else (window, window) if isinstance(window, int) else window
    kwargs = dict(
        scale=f["scale"], is_causal=f["causal"], query_seq_lengths=q_len,
        key_value_seq_lengths=kv_len, local_window_size=window,
    )  # fmt: skip
    scale = 1 / math.sqrt(h) if f["scale"] is None else f["scale"]
    want = numpy_attention(
        q, k, v, bias, mask, scale, f["causal"], q_len, kv_len, win_pair, f["cap"]
    )
    if f["unbatched"] and bias is None and mask is None and not f["lengths"]:
        unbatched = jax.jit(
            lambda q, k, v: attention(q, k, v, **kwargs, logits_soft_cap=f["cap"], executor=EX)
        )
        close(unbatched(q[0], k[0], v[0]), want[0], tol=TOL[jnp.float32])
    got = jax.jit(lambda *a: attention(*a, **kwargs, logits_soft_cap=f["cap"], executor=EX))(
        q, k, v, bias, mask
    )
    close(got, want, tol=TOL[jnp.float32])
    if f["cap"] is None:  # jax.nn has every other feature
        ref = jax.jit(lambda *a: jax.nn.dot_product_attention(*a, **kwargs))(q, k, v, bias, mask)
        close(got, ref, tol=TOL[jnp.float32])


def test_attention_gradients_match_jax_nn_for_q_k_v_and_bias():
    q, k, v = rand((2, 16, 4, 8), seed=0), rand((2, 16, 2, 8), seed=1), rand((2, 16, 2, 8), seed=2)
    bias = rand((1, 4, 16, 16), seed=3)
    w = rand((2, 16, 4, 8), seed=4)
    for with_bias in (False, True):
        b = bias if with_bias else None

        def ours(q, k, v, b):
            return (attention(q, k, v, b, is_causal=True, executor=EX) * w).sum()

        def ref(q, k, v, b):
            return (jax.nn.dot_product_attention(q, k, v, b, is_causal=True) * w).sum()

        argnums = (0, 1, 2, 3) if with_bias else (0, 1, 2)
        got = jax.jit(jax.grad(ours, argnums))(q, k, v, b)
        for g, r in zip(got, jax.jit(jax.grad(ref, argnums))(q, k, v, b)):
            close(g, r, tol=TOL[jnp.float32])


def test_the_pallas_attention_kernel_in_the_interpreter_matches_jax_nn():
    q, k, v = (
        rand((1, 16, 2, 16), seed=0),
        rand((1, 16, 2, 16), seed=1),
        rand((1, 16, 2, 16), seed=2),
    )
    kernel = AttentionInterpret(executor=EX)
    got = EX(kernel, q, k, v, causal=True, sm_scale=0.25)
    ref = jax.jit(lambda *a: jax.nn.dot_product_attention(*a, is_causal=True, scale=0.25))
    close(got, ref(q, k, v), tol=TOL[jnp.float32])
    w = rand(q.shape, seed=3)

    def loss(fn):
        return lambda *a: (fn(*a) * w).sum()

    grads = jax.grad(loss(lambda *a: EX(kernel, *a, causal=True, sm_scale=0.25)), (0, 1, 2))(
        q, k, v
    )
    want = jax.jit(
        jax.grad(
            loss(lambda *a: jax.nn.dot_product_attention(*a, is_causal=True, scale=0.25)),
            (0, 1, 2),
        )
    )(q, k, v)
    for g, r in zip(grads, want):
        close(g, r, tol=TOL[jnp.float32])


def test_a_traced_scale_works_under_jit_and_grad():
    q, k, v = rand((1, 16, 2, 8), seed=0), rand((1, 16, 2, 8), seed=1), rand((1, 16, 2, 8), seed=2)

    @jax.jit
    def f(scale):
        return attention(q, k, v, scale=scale, executor=EX).sum()

    ref = jax.jit(lambda s: jax.nn.dot_product_attention(q, k, v, scale=s).sum())(0.7)
    close(f(0.7), ref, tol=TOL[jnp.float32])
    g = jax.grad(f)(jnp.float32(0.7))
    want = jax.jit(jax.grad(lambda s: jax.nn.dot_product_attention(q, k, v, scale=s).sum()))(
        jnp.float32(0.7)
    )
    close(g, want, tol=TOL[jnp.float32])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: attention(jnp.ones((1, 4, 3, 8)), jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8))),
         r"key/value heads \(2\) must divide query heads \(3\)"),
        (lambda: attention(jnp.ones((2, 4, 2, 8)), jnp.ones((4, 2, 8)), jnp.ones((4, 2, 8))),
         "must agree on batch and head_dim"),
        (lambda: attention(jnp.ones((2, 4, 2, 8)), jnp.ones((2, 4, 2, 8)), jnp.ones((2, 4, 2, 8)),
                           query_seq_lengths=jnp.array([3], jnp.int32)),
         r"query_seq_lengths must be an int32 array of shape \(2,\)"),
        (lambda: attention(jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8)),
                           mask=jnp.ones((1, 3, 4, 4), bool)),
         r"mask must broadcast to \[batch, heads, q_len, kv_len\]"),
        (lambda: attention(jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8)),
                           local_window_size=1.5),
         "local_window_size must be an int or a pair"),
        (lambda: attention(jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8), jnp.bfloat16), jnp.ones((1, 4, 2, 8))),
         "value must have key's shape and dtype bfloat16"),
    ],
)  # fmt: skip
def test_attention_names_the_bad_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_second_derivatives_match_jax_on_the_xla_path():
    x = rand((3, 8), seed=0)
    w = rand((8, 8), seed=1)
    q = rand((1, 16, 2, 8), seed=2)
    pairs = [
        (
            lambda x: layer_norm(x, executor=EX),
            lambda x: flax_layer_norm(x, None, None, (1,), 1e-6),
        ),
        (lambda x: rms_norm(x, executor=EX), lambda x: flax_rms_norm(x, None, (1,), 1e-6)),
        (lambda x: softmax(x, executor=EX), jax.nn.softmax),
        (lambda x: matmul(x, w, executor=EX), lambda x: x @ w),
    ]
    # Each derivative compiled as one program (op by op, every primitive of the
    # hessian compiled on its own, took most of this test's time): the same values.
    for ours, ref in pairs:
        close(
            jax.jit(jax.hessian(lambda x, f=ours: (f(x) ** 3).sum()))(x),
            jax.jit(jax.hessian(lambda x, f=ref: (f(x) ** 3).sum()))(x),
            tol=TOL[jnp.float32],
        )

    def grad_of_grad(fn):
        return jax.jit(jax.grad(lambda q: jax.grad(lambda q: (fn(q) ** 2).sum())(q).sum()))(q)

    close(
        grad_of_grad(lambda q: attention(q, q, q, is_causal=True, executor=EX)),
        grad_of_grad(lambda q: jax.nn.dot_product_attention(q, q, q, is_causal=True)),
        tol=TOL[jnp.float32],
    )


# --- the public ops through the Pallas interpreter ----------------------------------
# `platform="triton"` off a GPU runs every bundled kernel's Pallas code in the Pallas
# interpreter, so these draws check the Pallas kernels (and their custom backward) with
# the public signatures, against jax.nn / jnp.

# No shrinking: each interpreted example takes seconds.
INTERPRETER = settings(
    SETTINGS, max_examples=3, phases=(Phase.explicit, Phase.reuse, Phase.generate)
)


@INTERPRETER
@given(
    st.sampled_from([(16, 16), (16, 32), (32, 16)]),  # the flash kernel tiles >= 16
    st.sampled_from([(2, 1), (2, 2), (4, 2)]),
    st.booleans(),
    st.sampled_from([None, 0.3]),
    st.sampled_from([jnp.float32, jnp.bfloat16]),
    st.integers(0, 2**16),
)
def test_attention_through_the_pallas_interpreter_matches_jax_nn(
    lens, heads, causal, scale, dtype, seed
):
    (t, s), (n, kh) = lens, heads
    if causal:
        s = t
    q = rand((1, t, n, 16), dtype, seed=seed)
    k, v = rand((1, s, kh, 16), dtype, seed=seed + 1), rand((1, s, kh, 16), dtype, seed=seed + 2)
    w = rand(q.shape, jnp.float32, seed=seed + 3)

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v).astype(jnp.float32) * w).sum()

    def ours(q, k, v):
        return attention(q, k, v, scale=scale, is_causal=causal, executor=EX)

    def ref(q, k, v):  # in float32: the reference's rounding is not under test
        f32 = [a.astype(jnp.float32) for a in (q, k, v)]
        return jax.nn.dot_product_attention(*f32, scale=scale, is_causal=causal)

    def value_and_grads(fn):
        # The value and the gradients in one compiled program, not one each.
        return jax.jit(lambda q, k, v: (fn(q, k, v), jax.grad(loss(fn), (0, 1, 2))(q, k, v)))

    with options.scoped(platform="triton"):
        got, grads = value_and_grads(ours)(q, k, v)
    # The reference compiled whole (op by op, each primitive compiles alone per shape).
    want, want_grads = value_and_grads(ref)(q, k, v)
    close(got, want, tol=TOL[dtype])
    for g, r in zip(grads, want_grads, strict=True):
        close(g, r, tol=TOL[dtype])


@INTERPRETER
@given(
    st.sampled_from([(4, 32), (3, 5, 64), (130,)]),
    st.sampled_from(["layer", "rms", "softmax"]),
    st.integers(0, 2**16),
)
def test_norms_and_softmax_through_the_pallas_interpreter_match_jax(shape, op, seed):
    x = rand(shape, seed=seed)
    scale = 1 + rand(shape[-1:], seed=seed + 1)
    bias = rand(shape[-1:], seed=seed + 2)
    w = rand(shape, seed=seed + 3)
    axes = (len(shape) - 1,)
    ours, ref = {
        "layer": (
            lambda x: layer_norm(x, scale, bias, executor=EX),
            lambda x: flax_layer_norm(x, scale, bias, axes, 1e-6),
        ),
        "rms": (
            lambda x: rms_norm(x, scale, executor=EX),
            lambda x: flax_rms_norm(x, scale, axes, 1e-6),
        ),
        "softmax": (lambda x: softmax(x, executor=EX), jax.nn.softmax),
    }[op]
    with options.scoped(platform="triton"):
        got = jax.jit(ours)(x)
        grad = jax.jit(jax.grad(lambda x: (ours(x) * w).sum()))(x)
    # The reference compiled whole (op by op, each primitive compiles alone per shape).
    close(got, jax.jit(ref)(x), tol=TOL[jnp.float32])
    close(grad, jax.jit(jax.grad(lambda x: (ref(x) * w).sum()))(x), tol=TOL[jnp.float32])


@INTERPRETER
@given(
    st.sampled_from([((16, 32), (32, 16)), ((2, 16, 32), (32, 8)), ((20, 24), (24, 40))]),
    st.integers(0, 2**16),
)
def test_matmul_through_the_pallas_interpreter_matches_jnp(shapes, seed):
    a, b = rand(shapes[0], seed=seed), rand(shapes[1], seed=seed + 1)
    with options.scoped(platform="triton"):
        # The value and the gradients in one compiled program, not one each.
        got, grads = jax.jit(
            lambda a, b: (
                matmul(a, b, executor=EX),
                jax.grad(lambda a, b: matmul(a, b, executor=EX).sum(), (0, 1))(a, b),
            )
        )(a, b)
    close(got, a @ b, tol=TOL[jnp.float32])
    want = jax.jit(jax.grad(lambda a, b: (a @ b).sum(), (0, 1)))(a, b)  # compiled whole
    for g, r in zip(grads, want, strict=True):
        close(g, r, tol=TOL[jnp.float32])


def test_every_op_runs_when_the_pallas_platform_is_forced_off_a_tpu():
    # Issue 13.4: KERNELTUNE_PLATFORM=pallas on a CPU broke every bundled kernel with
    # an error addressed to kernel authors; they now run their XLA code.
    x, w = rand((4, 16), seed=0), rand((16,), seed=1)
    q = rand((1, 16, 2, 16), seed=2)
    with options.scoped(platform="pallas"):
        outs = [
            layer_norm(x, w, executor=EX),
            rms_norm(x, w, executor=EX),
            softmax(x, executor=EX),
            matmul(x, x.T, executor=EX),
            attention(q, q, q, is_causal=True, executor=EX),
            jax.grad(lambda q: attention(q, q, q, executor=EX).sum())(q),
        ]
    # The references compiled whole, as one program (op by op, each primitive compiles
    # alone).
    refs = jax.jit(
        lambda x, w, q: [
            flax_layer_norm(x, w, None, (1,), 1e-6),
            flax_rms_norm(x, w, (1,), 1e-6),
            jax.nn.softmax(x),
            x @ x.T,
            jax.nn.dot_product_attention(q, q, q, is_causal=True),
            jax.grad(lambda q: jax.nn.dot_product_attention(q, q, q).sum())(q),
        ]
    )(x, w, q)
    for got, want in zip(outs, refs, strict=True):
        close(got, want, tol=TOL[jnp.float32])


def test_forward_mode_is_refused_where_docs_ops_says_and_hessians_work():
    # docs/ops.md ("Forward mode"): where the flash kernel runs, plain attention's
    # gradient is a custom VJP, which JAX does not take forward; if that changes, the
    # page must change with it. On a CPU it is XLA code JAX differentiates both ways.
    f, a = (lambda q: attention(q, q, q, is_causal=True)), rand((1, 16, 2, 16))
    with options.scoped(platform="triton"), pytest.raises(TypeError, match="forward-mode"):
        jax.jvp(f, (a,), (jnp.ones_like(a),))
    out, tangent = jax.jvp(f, (a,), (jnp.ones_like(a),))
    assert tangent.shape == a.shape and bool(jnp.isfinite(tangent).all())
    x, w, labels = rand((16, 8)), rand((8, 32)), jnp.arange(16) % 32
    head = lambda x: linear_softmax_cross_entropy(x, labels, w)  # noqa: E731
    plain = lambda x: jnp.mean(  # noqa: E731
        jax.nn.logsumexp(x @ w, -1) - jnp.take_along_axis(x @ w, labels[:, None], -1)[:, 0]
    )
    # On a CPU the loss head up to 2 GiB of logits is plain JAX's program.
    close(jax.jvp(head, (x,), (x,))[1], jax.jvp(plain, (x,), (x,))[1], tol=1e-5)
    hess = jax.hessian(lambda a: (f(a) ** 2).sum())(a)  # forward over reverse works
    assert hess.shape == a.shape * 2 and bool(jnp.isfinite(hess).all())
    x = rand((8, 16))
    for op in (layer_norm, softmax):  # other ops: it works
        out, tangent = jax.jvp(op, (x,), (jnp.ones_like(x),))
        assert out.shape == tangent.shape == x.shape


def _glu(x, w):
    return jax.nn.silu(x @ w[:, 0]) * (x @ w[:, 1])


@pytest.mark.parametrize(
    "ours, theirs, args",
    [
        (ragged_dot, jax.lax.ragged_dot, ((16, 8), (2, 9, 4), (2,))),  # K
        (ragged_dot, jax.lax.ragged_dot, ((16, 8), (3, 8, 4), (2,))),  # G
        (ragged_dot, jax.lax.ragged_dot, ((16, 8), (8, 4), (2,))),  # rhs not [G, K, N]
        (ragged_dot, jax.lax.ragged_dot, ((16, 8), (2, 8, 4), (1, 2))),  # group_sizes 2-D
        (gated_linear_unit, _glu, ((4, 8), (9, 2, 3))),  # K
    ],
    ids=["ragged_dot_k", "ragged_dot_groups", "ragged_dot_rhs_rank", "ragged_dot_sizes", "glu_k"],
)
def test_a_shape_mismatch_raises_what_jax_raises_and_a_value_error(ours, theirs, args):
    # Before: ValueError only, so code written against JAX (`pytest.raises(TypeError)`,
    # `except TypeError`) missed ours; kerneltune's own callers catch ValueError.
    arrays = [
        jnp.full(shape, 2, jnp.int32) if i == 2 else jnp.ones(shape) for i, shape in enumerate(args)
    ]
    with pytest.raises(TypeError):
        theirs(*arrays)
    with pytest.raises(TypeError) as caught:
        ours(*arrays, executor=EX)
    assert isinstance(caught.value, ValueError)
