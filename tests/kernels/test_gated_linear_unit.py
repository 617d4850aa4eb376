"""The gated linear unit (`gated_linear_unit`): XLA and the fused Pallas kernel against
plain float32 JAX for both weight forms and several activations, dtypes, jit/grad/vmap,
leading dims, tuning with validation, tokamax pruned where absent, and bad input
(issue 29)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kerneltune as kt
from kerneltune.kernels import (
    GatedLinearUnit,
    GatedLinearUnitInterpret,
    GLUConfig,
    gated_linear_unit,
)
from kerneltune.kernels._common import relative_error, tolerance
from kerneltune.kernels.gated_linear_unit import config as gc
from kerneltune.kernels.gated_linear_unit import tokamax_backend
from kerneltune.kernels.gated_linear_unit.reference import glu_reference
from kerneltune.kernels.gated_linear_unit.shapes import TEST_SHAPES
from tests.helpers import FixedChooser, heuristics_executor, normal

BF16 = jnp.bfloat16
FUSED = GLUConfig(backend="triton", block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)
EX = heuristics_executor()
KERNEL = GatedLinearUnitInterpret(executor=EX)


def squared(z):
    return z * z


ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu": jax.nn.gelu,
    "lambda": lambda z: jnp.tanh(z) * 2.0,
}


def operands(seed, m, k, n, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    x = normal(rng, (m, k), dtype)
    w = normal(rng, (k, 2, n), dtype, scale=1 / np.sqrt(k))
    dout = normal(rng, (m, n), dtype)
    return x, w, dout


def _value_and_cotangents(fn, x, w, dout):
    out, pullback = jax.vjp(fn, x, w)
    return out, pullback(dout)


def check(fn, x, w, dout, activation, dtype):
    # Each side compiled whole: op by op, every primitive compiled alone for every
    # drawn shape.
    out, grads = jax.jit(lambda x, w, d: _value_and_cotangents(fn, x, w, d))(x, w, dout)

    def reference(x, w, d):
        f32 = jax.tree.map(lambda a: a.astype(jnp.float32), (x, w, d))
        return _value_and_cotangents(lambda x, w: glu_reference(x, w, activation), *f32)

    r_out, r_grads = jax.jit(reference)(x, w, dout)
    assert out.dtype == dtype and out.shape == r_out.shape
    assert relative_error(out, r_out) <= tolerance(dtype)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(r_grads), strict=True):
        assert g.dtype == dtype
        assert relative_error(g, r) <= 2 * tolerance(dtype)


# --- configs and candidates ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "cublas"}, r"backend must be one of"),
        ({"backend": "xla", "block_m": 64}, r"block_m is a field of backend='triton'"),
        ({"backend": "triton", "block_n": 48}, r"block_n must be a positive power of two"),
        ({"backend": "triton", "block_k": 8}, r"block_k must be at least 16"),
    ],
)
def test_config_is_validated_where_it_is_built(fields, message):
    with pytest.raises(ValueError, match=message):
        GLUConfig(**fields)


def test_candidates_are_pruned_with_reasons():
    p = gc.GLUProblem(16384, 2048, 5632, np.dtype("bfloat16"))
    kept, pruned = gc.triton_candidates(p, smem_limit=100 * 1024)
    assert kept and all(gc.shared_memory_bytes(p, c) <= 100 * 1024 for c in kept)
    reasons = " ".join(x.reason for x in pruned)
    assert "shared memory" in reasons
    _, pruned = gc.triton_candidates(gc.GLUProblem(4096, 2048, 1000, np.dtype("bfloat16")))
    assert any("N=1000 is not a multiple of block_n=64" in x.reason for x in pruned)
    assert gc.heuristic(p) == gc.XLA


def test_both_of_plain_jaxs_forms_of_fused_weights_are_candidates():
    # One dot over [K, 2, N] or two over its halves: each is faster at some shapes in
    # training (an H200, 32768 x 2048 -> 5632: the one-dot form 0.98x the two dots), so
    # the tuner times both. A pair of weights is two dots under "xla" already.
    ex = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache()))
    x, w, _ = operands(0, 32, 32, 64)
    kept, pruned = GatedLinearUnit().search_space(ex.invocation(GatedLinearUnit(), x, w))
    assert kept[:2] == [gc.XLA, gc.XLA_SPLIT]
    pair_inv = ex.invocation(GatedLinearUnit(), x, (w[:, 0], w[:, 1]))
    kept, pruned = GatedLinearUnit().search_space(pair_inv)
    assert gc.XLA_SPLIT not in kept
    (reason,) = [p.reason for p in pruned if p.cfg == gc.XLA_SPLIT]
    assert "two dots" in reason


def test_tokamax_is_pruned_with_a_reason_where_it_cannot_run(monkeypatch):
    # This machine has no GPU; tokamax is absent or its kernel cannot run here.
    inv = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache())).invocation(
        GatedLinearUnit(), *operands(0, 32, 32, 64)[:2]
    )
    kept, pruned = GatedLinearUnit().search_space(inv)
    assert gc.TOKAMAX not in kept and kept[0] == gc.XLA
    (reason,) = [p.reason for p in pruned if p.cfg == gc.TOKAMAX]
    assert reason == tokamax_backend.unsupported() and "tokamax" in reason
    # Where Pallas runs (interpreted here) a tokamax config says why it cannot run;
    # elsewhere the XLA fallback runs every config.
    assert GatedLinearUnit(interpret=True).config_unusable(inv, gc.TOKAMAX) == reason
    assert GatedLinearUnit().config_unusable(inv, gc.TOKAMAX) is None
    tokamax_backend.installed.cache_clear()
    monkeypatch.setattr(tokamax_backend.importlib.util, "find_spec", lambda name: None)
    try:
        assert "not installed" in (tokamax_backend.unsupported() or "")
    finally:
        tokamax_backend.installed.cache_clear()


# --- values and gradients --------------------------------------------------------------


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize(
    "cfg", [GLUConfig(), GLUConfig(backend="xla_split"), FUSED], ids=["xla", "xla_split", "triton"]
)
def test_values_and_gradients_match_plain_jax(cfg, activation):
    act = ACTIVATIONS[activation]
    x, w, dout = operands(1, *TEST_SHAPES[1])
    check(lambda x, w: EX(KERNEL, x, w, activation=act, cfg=cfg), x, w, dout, act, jnp.float32)


@pytest.mark.parametrize(
    "cfg", [GLUConfig(), GLUConfig(backend="xla_split"), FUSED], ids=["xla", "xla_split", "triton"]
)
def test_a_pair_of_weights(cfg):
    x, w, dout = operands(2, *TEST_SHAPES[0])
    pair = (w[:, 0], w[:, 1])

    def fn(x, pair):
        return EX(KERNEL, x, pair, activation=jax.nn.silu, cfg=cfg)

    check(fn, x, pair, dout, jax.nn.silu, jnp.float32)


def test_bfloat16_fused():
    x, w, dout = operands(3, 32, 32, 48, BF16)
    check(
        lambda x, w: EX(KERNEL, x, w, activation=jax.nn.silu, cfg=FUSED),
        x,
        w,
        dout,
        jax.nn.silu,
        BF16,
    )


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 24),
    k=st.integers(1, 24),
    n=st.integers(1, 24),
    seed=st.integers(0, 2**16),
)
def test_drawn_shapes_fused(m, k, n, seed):
    x, w, dout = operands(seed, m, k, n)
    check(
        lambda x, w: EX(KERNEL, x, w, activation=jax.nn.silu, cfg=FUSED),
        x,
        w,
        dout,
        jax.nn.silu,
        jnp.float32,
    )


def test_activations_are_told_apart():
    # Two functions with the same qualified name must not share a compiled program.
    x, w, _ = operands(4, 16, 16, 16)
    outs = [
        gated_linear_unit(x, w, activation=act, executor=EX)
        for act in (lambda z: z, lambda z: -z, None, jax.nn.relu)
    ]
    assert relative_error(outs[1], -outs[0]) <= 1e-6
    assert relative_error(outs[2], outs[0]) <= 1e-6
    assert relative_error(outs[3], glu_reference(x, w, jax.nn.relu)) <= tolerance(jnp.float32)


def test_callable_objects_are_activations_too():
    # Before: an instance with __call__, or a partial of a jnp.ufunc, raised "stable_json
    # cannot encode a value of type ..." where jax.nn.silu and lambdas worked.
    import functools

    class Leaky:
        def __init__(self, slope):
            self.slope = slope

        def __call__(self, z):
            return jnp.where(z > 0, z, self.slope * z)

    x, w, _ = operands(4, 16, 16, 16)
    for act in (Leaky(0.1), Leaky(0.3), functools.partial(jnp.maximum, 0.0)):
        got = gated_linear_unit(x, w, activation=act, executor=EX)
        assert relative_error(got, glu_reference(x, w, act)) <= tolerance(jnp.float32)


# --- the public function: leading dims, jit, grad, vmap --------------------------------


def test_public_function_flattens_leading_dims_under_jit_and_grad():
    a, b = jax.random.split(jax.random.PRNGKey(5))
    x = jax.random.normal(a, (2, 3, 16), jnp.float32)
    w = jax.random.normal(b, (16, 2, 8), jnp.float32) / 4

    def loss(x, w):
        return jnp.sum(gated_linear_unit(x, w, executor=EX) ** 2)

    def ref(x, w):
        return jnp.sum(glu_reference(x.reshape(-1, 16), w, jax.nn.silu) ** 2)

    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    want = jax.jit(jax.value_and_grad(ref, argnums=(0, 1)))(x, w)  # the reference compiled whole
    assert gated_linear_unit(x, w, executor=EX).shape == (2, 3, 8)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert relative_error(g, r) <= 2 * tolerance(jnp.float32)


@pytest.mark.parametrize("pair", [False, True], ids=["fused", "pair"])
def test_precision_is_taken_as_tokamax_takes_it(pair):
    # tokamax.gated_linear_unit(x, weights, activation=..., precision=...): the dots'
    # precision. HIGHEST on bfloat16 inputs must give what plain JAX's dots give.
    x, w, dout = operands(21, 12, 32, 8, BF16)
    weights = (w[:, 0], w[:, 1]) if pair else w
    hi = jax.lax.Precision.HIGHEST

    def fn(x, w):
        return gated_linear_unit(x, w, activation=jax.nn.gelu, precision=hi, executor=EX)

    def plain(x, w):
        gate, up = (w[0], w[1]) if isinstance(w, tuple) else (w[:, 0], w[:, 1])
        return jax.nn.gelu(jnp.dot(x, gate, precision=hi)) * jnp.dot(x, up, precision=hi)

    out, grads = _value_and_cotangents(fn, x, weights, dout)
    want, want_grads = _value_and_cotangents(plain, x, weights, dout)
    assert out.dtype == BF16
    assert relative_error(out, want) <= tolerance(BF16)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        assert g.dtype == r.dtype and relative_error(g, r) <= 2 * tolerance(BF16)
    check(fn, x, weights, dout, jax.nn.gelu, BF16)


@pytest.mark.parametrize(
    ("pair", "backend"),
    [(False, "xla"), (True, "xla"), (False, "xla_split")],
    ids=["fused", "pair", "fused-split"],
)
def test_xla_choice_compiles_plain_jaxs_program_on_nd_x(pair, backend):
    # Keyed by the flattened rows, XLA's choice ran on them, a different program from
    # plain JAX's on [B, T, D] (its weight gradients laid out differently); under a
    # trace it now runs on the N-D x, the program plain JAX compiles.
    from benchmarks.harness import program_text
    from kerneltune.kernels.gated_linear_unit.reference import glu_xla

    a, b = jax.random.split(jax.random.PRNGKey(7))
    x = jax.random.normal(a, (2, 3, 16), jnp.float32)
    w = jax.random.normal(b, (16, 2, 8), jnp.float32) / 4
    w = (w[:, 0], w[:, 1]) if pair else w
    ex = kt.Executor(FixedChooser(GLUConfig(backend=backend)))

    def step(glu):
        return jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.tanh(glu(x, w))), argnums=(0, 1)))

    def plain_glu(x, w):
        if backend == "xla_split":  # what a user writes: two dots over the halves
            return jax.nn.silu(jnp.dot(x, w[:, 0])) * jnp.dot(x, w[:, 1])
        return glu_xla(x, w, jax.nn.silu)

    ours = step(lambda x, w: gated_linear_unit(x, w, executor=ex))
    plain = step(plain_glu)
    assert program_text(ours, (x, w)) == program_text(plain, (x, w))
    for g, r in zip(jax.tree.leaves(ours(x, w)), jax.tree.leaves(plain(x, w)), strict=True):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("cfg", [None, FUSED], ids=["heuristic", "triton"])
def test_vmap_of_values_and_gradients(cfg):
    xs = jax.random.normal(jax.random.PRNGKey(6), (3, 16, 16), jnp.float32)
    _, w, _ = operands(6, 16, 16, 16)
    kernel = KERNEL if cfg is not None else None

    def loss(x):
        if kernel is None:
            return jnp.sum(gated_linear_unit(x, w, executor=EX))
        return jnp.sum(EX(kernel, x, w, activation=jax.nn.silu, cfg=cfg))

    out, dx = jax.vmap(jax.value_and_grad(loss))(xs)
    # The reference compiled whole, once for the three rows (op by op, each primitive
    # compiles alone).
    reference = jax.jit(jax.value_and_grad(lambda x: jnp.sum(glu_reference(x, w, jax.nn.silu))))
    for i in range(3):
        r_out, r_dx = reference(xs[i])
        assert relative_error(out[i], r_out) <= tolerance(jnp.float32)
        assert relative_error(dx[i], r_dx) <= 2 * tolerance(jnp.float32)


# --- tuning ---------------------------------------------------------------------------


def test_tuning_validates_the_fused_kernel_against_the_reference():
    events: list = []
    ex = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(),
            tuner=kt.Tuner(progress=False, iters=1, target_sample_s=1e-4),
            on_event=lambda e, **d: events.append((e, d)),
        )
    )
    x, w, _ = operands(7, 32, 32, 32)
    kernel = GatedLinearUnitInterpret(executor=ex)
    out = ex(kernel, x, w, activation=jax.nn.gelu)
    assert relative_error(out, glu_reference(x, w, jax.nn.gelu)) <= tolerance(jnp.float32)
    (report,) = [d["report"] for e, d in events if e == "autotune_finish"]
    assert report.validated and not report.failures
    assert {c.cfg.backend for c in report.candidates} == {"xla", "triton"}


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "w", "error", "message"),
    [
        (jnp.ones((4, 8)), jnp.ones((8, 3, 5)), ValueError, r"weights must be \[K, 2, N\]"),
        (jnp.ones((4, 8)), jnp.ones((7, 2, 5)), ValueError, r"K = x.shape\[-1\] = 8"),
        (jnp.ones((4, 8)), (jnp.ones((8, 5)), jnp.ones((8, 6))), ValueError, r"as a pair"),
        (jnp.ones((4, 8)), (jnp.ones((8, 5)),), ValueError, r"must have 2 arrays"),
        # (strict promotion, as this suite runs: refused as jnp.matmul refuses it)
        (jnp.ones((4, 8)), jnp.ones((8, 2, 5), BF16), jax.dtypes.TypePromotionError, "strict"),
        (jnp.ones((4, 8), jnp.int32), jnp.ones((8, 2, 5), jnp.int32), TypeError, r"floating"),
    ],
)
def test_bad_input_is_named(x, w, error, message):
    with pytest.raises(error, match=message):
        gated_linear_unit(x, w, executor=EX)


@pytest.mark.parametrize("pair", [False, True], ids=["fused", "pair"])
def test_weights_of_another_dtype_are_promoted_as_jnp_matmul_promotes(pair):
    # float32 master weights with bfloat16 activations: tokamax's GLU multiplies them
    # as jnp.matmul does (standard promotion) and returns x's dtype.
    x, w, dout = operands(22, 12, 16, 8, BF16)
    w32 = w.astype(jnp.float32) * 1.01  # digits bfloat16 does not hold
    weights = (w32[:, 0], w32[:, 1]) if pair else w32
    with jax.numpy_dtype_promotion("standard"):
        out, (dx, dw) = _value_and_cotangents(
            lambda x, w: gated_linear_unit(x, w, executor=EX), x, weights, dout
        )
        want, (r_dx, r_dw) = _value_and_cotangents(
            lambda x, w: glu_reference(x, w, jax.nn.silu).astype(BF16), x, weights, dout
        )
    assert out.dtype == BF16 and dx.dtype == BF16
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(dw))
    assert relative_error(out, want) <= tolerance(BF16)
    assert relative_error(dx, r_dx) <= 2 * tolerance(BF16)
    for g, r in zip(jax.tree.leaves(dw), jax.tree.leaves(r_dw), strict=True):
        assert relative_error(g, r) <= 2 * tolerance(jnp.float32)


def test_activation_must_be_callable():
    with pytest.raises(TypeError, match=r"activation must be callable"):
        gated_linear_unit(jnp.ones((4, 8)), jnp.ones((8, 2, 5)), activation="silu", executor=EX)


def test_second_derivatives_of_the_fused_kernel():
    x, w, _ = operands(8, 16, 16, 16)

    def grad_norm(f):
        return lambda x: jnp.sum(jax.grad(lambda z: jnp.sum(f(z) ** 2))(x) ** 2)

    got = jax.jit(
        jax.grad(grad_norm(lambda z: EX(KERNEL, z, w, activation=jax.nn.silu, cfg=FUSED)))
    )(x)
    # The reference compiled whole (op by op, each primitive compiles alone).
    want = jax.jit(jax.grad(grad_norm(lambda z: glu_reference(z, w, jax.nn.silu))))(x)
    assert relative_error(got, want) <= 1e-4
