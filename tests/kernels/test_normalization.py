"""Layer norm and RMS norm: JAX's Pallas GPU kernels with our launch parameters, and
the XLA path; values and gradients against a float32 reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kerneltune.kernels import (
    LayerNormInterpret,
    NormConfig,
    RMSNormInterpret,
    layer_norm,
    rms_norm,
)
from kerneltune.kernels._common import relative_error, tolerance
from kerneltune.kernels.normalization import config as nc
from kerneltune.kernels.normalization.reference import layer_norm_reference, rms_norm_reference
from kerneltune.kernels.normalization.shapes import TEST_SHAPES
from tests.helpers import FixedChooser, heuristics_executor, host_rng, normal, value_and_grads

BF16 = jnp.bfloat16


executor = heuristics_executor


def inputs(key, shape, dtype):
    rng = host_rng(key)
    n = shape[-1]
    x = normal(rng, shape, dtype, loc=2.0, scale=3.0)  # mean and scale away from 0, 1
    w = normal(rng, (n,), dtype, loc=1.0, scale=0.2)
    bias = normal(rng, (n,), dtype, scale=0.2)
    dout = normal(rng, shape, dtype)
    return x, w, bias, dout


def check(fn, ref, args, dout, dtype):
    out, grads = value_and_grads(fn, args, dout)
    f32 = tuple(a.astype(jnp.float32) for a in args)
    r, rgrads = value_and_grads(ref, f32, dout.astype(jnp.float32))
    assert out.dtype == dtype and out.shape == args[0].shape
    assert relative_error(out, r) <= tolerance(dtype)
    for g, rg in zip(grads, rgrads):
        assert g.dtype == dtype
        assert relative_error(g, rg) <= 2 * tolerance(dtype)


# --- configs ------------------------------------------------------------------------


def test_config_is_validated():
    with pytest.raises(
        ValueError, match=r"NormConfig\.block_size must be a positive power of two, got 100"
    ):
        NormConfig(block_size=100)
    with pytest.raises(ValueError, match=r"NormConfig\.num_warps"):
        NormConfig(num_warps=0)


@pytest.mark.parametrize(
    ("n", "dtype", "block", "warps"),
    [
        (1000, np.float32, 1024, 4),
        (64, np.float32, 128, 1),
        (8192, np.dtype(BF16), 4096, 8),
        (256, np.float32, 256, 1),
    ],
)
def test_heuristic_is_jax_s_own_choice(n, dtype, block, warps):
    assert nc.heuristic(nc.NormProblem(8, n, np.dtype(dtype))) == NormConfig(
        block_size=block, num_warps=warps
    )


def test_candidates_are_pruned_with_reasons():
    kept, pruned = nc.candidates(nc.NormProblem(1024, 512, np.dtype(BF16)))
    assert kept[0] == nc.XLA  # XLA's fusion: the GPU heuristic, and a contender
    assert all(c.block_size <= 512 for c in kept if c.backend == "pallas")
    assert any("larger than the row" in p.reason for p in pruned)
    assert any("more threads" in p.reason for p in pruned)


def test_float64_rows_leave_only_xla_which_computes_in_float64():
    # The Pallas kernel computes in float32: a float64 norm tuned onto it, or run by
    # it in the interpreter, lost half its digits.
    p = nc.NormProblem(16, 256, np.dtype(np.float64))
    kept, pruned = nc.candidates(p)
    assert kept == [nc.XLA]
    assert pruned and all("computes in float32" in q.reason for q in pruned)
    assert nc.interpret_candidates(p) == [nc.XLA]


def test_the_backend_round_trips_and_is_validated():
    import kerneltune as kt

    assert kt.from_json(kt.to_json(nc.XLA), nc.NormConfig) == nc.XLA
    with pytest.raises(ValueError, match=r"NormConfig.backend must be 'pallas' or 'xla'"):
        nc.NormConfig(backend="cuda")


# --- XLA path -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", TEST_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_layer_norm_xla(key, shape, dtype):
    x, w, b, do = inputs(key, shape, dtype)
    ex = executor()
    check(lambda *a: layer_norm(*a, executor=ex), layer_norm_reference, (x, w, b), do, dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", TEST_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_xla(key, shape, dtype):
    x, w, _, do = inputs(key, shape, dtype)
    ex = executor()
    check(lambda *a: rms_norm(*a, executor=ex), rms_norm_reference, (x, w), do, dtype)


# --- Pallas in the interpreter --------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "dtype", "block"),
    [
        ((4, 8, 256), jnp.float32, 128),  # several steps over the row
        ((15, 200), BF16, 256),  # a row shorter than the block: masked lanes
    ],
)
def test_layer_norm_pallas(key, shape, dtype, block):
    x, w, b, do = inputs(key, shape, dtype)
    ex = executor()
    kernel = LayerNormInterpret(executor=ex)
    cfg = NormConfig(block_size=block, num_warps=4)
    check(lambda *a: ex(kernel, *a, cfg=cfg), layer_norm_reference, (x, w, b), do, dtype)


@pytest.mark.parametrize(
    ("shape", "dtype", "block"), [((4, 8, 256), jnp.float32, 128), ((3, 1000), BF16, 512)]
)
def test_rms_norm_pallas(key, shape, dtype, block):
    x, w, _, do = inputs(key, shape, dtype)
    ex = executor()
    kernel = RMSNormInterpret(executor=ex)
    cfg = NormConfig(block_size=block, num_warps=2)
    check(lambda *a: ex(kernel, *a, cfg=cfg), rms_norm_reference, (x, w), do, dtype)


def test_eps_is_a_static_argument(key):
    x, w, b, _ = inputs(key, (4, 64), jnp.float32)
    out = layer_norm(x, w, b, epsilon=0.5, executor=executor())
    assert relative_error(out, layer_norm_reference(x, w, b, eps=0.5)) <= 1e-5
    assert relative_error(out, layer_norm_reference(x, w, b)) > 1e-3


@pytest.mark.parametrize("dtype", [jnp.float32, BF16])
def test_scale_offset_shifts_the_scale_as_tokamax_does(key, dtype):
    # tokamax.layer_norm(..., scale_offset=1.0) scales by `1 + scale` (Gemma's stored
    # scale); without a scale there is nothing to shift.
    x, w, b, dout = inputs(key, (6, 48), dtype)
    delta = normal(host_rng(key), (48,), dtype, scale=0.1)  # a scale near 0, as Gemma stores it
    for norm, ref, params in (
        (layer_norm, layer_norm_reference, (delta, b)),
        (rms_norm, rms_norm_reference, (delta,)),
    ):

        def shifted(x, *p, norm=norm):
            return norm(x, *p, scale_offset=1.0, executor=executor())

        def want(x, s, *rest, ref=ref):
            return ref(x, s + 1.0, *rest)

        check(shifted, want, (x, *params), dout, dtype)
        bare = norm(x, scale_offset=1.0, executor=executor())
        np.testing.assert_array_equal(bare, norm(x, executor=executor()))
    with pytest.raises(TypeError, match="scale_offset must be a Python number"):
        rms_norm(x, w, scale_offset="one", executor=executor())


@pytest.mark.parametrize("dtype", [jnp.float32, BF16])
def test_subtract_mean_false_is_tokamaxs_rms_norm_form(key, dtype):
    # tokamax's layer_norm(x, scale, offset, subtract_mean=False): an RMS norm, then
    # the offset (its tests pass `subtract_mean` on every call).
    x, w, b, dout = inputs(key, (5, 40), dtype)

    def rms_plus_offset(x, w, b):
        return layer_norm(x, w, b, subtract_mean=False, executor=executor())

    def want(x, w, b):
        return rms_norm_reference(x, w) + b

    check(rms_plus_offset, want, (x, w, b), dout, dtype)
    check(
        lambda x, w: layer_norm(x, w, subtract_mean=False), rms_norm_reference, (x, w), dout, dtype
    )
    assert relative_error(
        layer_norm(x, w, b, subtract_mean=True, executor=executor()), layer_norm_reference(x, w, b)
    ) <= tolerance(dtype)


def test_subtract_mean_false_offsets_every_normalised_axis(key):
    rng = host_rng(key)
    x = normal(rng, (3, 4, 6), jnp.float32, loc=1.0)
    b = normal(rng, (3, 6), jnp.float32)
    got = layer_norm(x, None, b, axis=(0, 2), subtract_mean=False, executor=executor())
    ms = jnp.mean(jnp.square(x), axis=(0, 2), keepdims=True)
    want = x * jax.lax.rsqrt(ms + 1e-6) + b[:, None, :]
    assert got.shape == x.shape and relative_error(got, want) <= tolerance(jnp.float32)
    with pytest.raises(TypeError, match="subtract_mean must be a bool"):
        layer_norm(x, subtract_mean="no", executor=executor())


def test_bad_parameters_are_rejected():
    with pytest.raises(
        ValueError, match=r"scale must have the shape of the normalised axes \(8,\), got \(4,\)"
    ):
        layer_norm(jnp.ones((2, 8)), jnp.ones(4), jnp.ones(8), executor=executor())
    with pytest.raises(TypeError, match="rms_norm-interpret takes x, weight"):
        executor()(RMSNormInterpret(), jnp.ones((2, 8)), jnp.ones(8), jnp.ones(8))


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_xla_choice_compiles_plain_jaxs_program_on_nd_x(norm):
    # Keyed by the flattened rows, XLA's norm ran on them: a different program from
    # plain JAX's on [B, T, D] (the next matmul's weight gradient laid out differently
    # in a GPT block on an H100). Under a trace it now runs on x as it is.
    import kerneltune as kt
    from benchmarks.harness import program_text
    from kerneltune.kernels import layer_norm, rms_norm
    from kerneltune.kernels.normalization.reference import layer_norm_xla, rms_norm_xla

    a, b, c = jax.random.split(jax.random.PRNGKey(3), 3)
    x = jax.random.normal(a, (2, 3, 16), jnp.float32)
    w = jax.random.normal(b, (16, 8), jnp.float32)
    scale, bias = jnp.full((16,), 1.5), jnp.full((16,), 0.25)
    ex = kt.Executor(FixedChooser(nc.XLA))
    if norm == "layer_norm":
        ours = lambda x, w: layer_norm(x, scale, bias, epsilon=1e-5, executor=ex) @ w  # noqa: E731
        plain = lambda x, w: layer_norm_xla(x, scale, bias, eps=1e-5) @ w  # noqa: E731
    else:
        ours = lambda x, w: rms_norm(x, scale, epsilon=1e-5, executor=ex) @ w  # noqa: E731
        plain = lambda x, w: rms_norm_xla(x, scale, eps=1e-5) @ w  # noqa: E731

    def step(f):
        return jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.tanh(f(x, w))), argnums=(0, 1)))

    assert program_text(step(ours), (x, w)) == program_text(step(plain), (x, w))
    for g, r in zip(step(ours)(x, w), step(plain)(x, w), strict=True):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize(
    "kernel", [LayerNormInterpret(), RMSNormInterpret()], ids=["layer_norm", "rms_norm"]
)
def test_a_training_call_is_tuned_on_forward_and_backward(kernel):
    # A Pallas norm's forward beat XLA's by 6% on an H200 while its backward made a
    # GPT block's step 9% slower: the training call is a key of its own, timed on
    # forward + backward, apart from the forward-only call at the same shapes.
    from tests.helpers import executor as tuning_executor

    events = []
    ex = tuning_executor(events=events)
    x, w, bias, _ = inputs(jax.random.PRNGKey(0), (8, 128), jnp.float32)
    params = (w, bias) if kernel.which == "layer_norm" else (w,)
    ref = layer_norm_reference if kernel.which == "layer_norm" else rms_norm_reference

    ex(kernel, x, *params, eps=1e-6)
    grads = jax.jit(jax.grad(lambda x: jnp.sum(jnp.tanh(ex(kernel, x, *params, eps=1e-6)))))(x)
    tuned = [(d["call_key"], d["backward"]) for e, d in events if e == "autotune_start"]
    assert [backward for _, backward in tuned] == [False, True]
    assert tuned[0][0] != tuned[1][0]
    # The reference compiled whole (op by op, each of its primitives compiles alone).
    expected = jax.jit(jax.grad(lambda x: jnp.sum(jnp.tanh(ref(x, *params, eps=1e-6)))))(x)
    assert relative_error(grads, expected) <= 2 * tolerance(jnp.float32)
