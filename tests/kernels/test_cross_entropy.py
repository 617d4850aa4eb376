"""The loss head (`linear_softmax_cross_entropy`): every backend's values and gradients
against plain float32 JAX, masks, reductions, dtypes, jit/grad/vmap, tuning with
validation, and bad input (issue 29)."""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kerneltune as kt
from kerneltune.kernels import (
    CrossEntropyConfig,
    LinearSoftmaxCrossEntropy,
    LinearSoftmaxCrossEntropyInterpret,
    linear_softmax_cross_entropy,
)
from kerneltune.kernels._common import relative_error, tolerance
from kerneltune.kernels.cross_entropy import config as cc
from kerneltune.kernels.cross_entropy.reference import cross_entropy_reference
from kerneltune.kernels.cross_entropy.shapes import TEST_SHAPES
from tests.helpers import heuristics_executor, normal

BF16 = jnp.bfloat16
CHUNKED = CrossEntropyConfig(backend="chunked", chunk_size=16)
FUSED = CrossEntropyConfig(backend="triton", chunk_size=16, block_m=16, block_v=32, block_k=16)
#: Chunks whose log-sum-exp is the Pallas kernel's (interpreted here).
CHUNKED_LSE = CrossEntropyConfig(backend="chunked", chunk_size=16, lse_backend="triton")
BACKENDS = {
    "xla": CrossEntropyConfig(),
    "chunked": CHUNKED,
    "chunked-lse": CHUNKED_LSE,
    "triton": FUSED,
}
#: The 16-bit-logits forms: plain JAX's `x @ w` program, and chunks of it.
INPUT_LOGITS = {
    "xla": CrossEntropyConfig(logits_dtype="input"),
    "chunked": CrossEntropyConfig(backend="chunked", chunk_size=16, logits_dtype="input"),
}

EX = heuristics_executor()
KERNEL = LinearSoftmaxCrossEntropyInterpret(executor=EX)


def problem(seed, m, k, v, dtype=jnp.float32, masked=0.3):
    rng = np.random.default_rng(seed)
    x = normal(rng, (m, k), dtype)
    w = normal(rng, (k, v), dtype, scale=3 / np.sqrt(k))
    labels = jnp.asarray(rng.integers(0, v, m, dtype=np.int32))
    where = rng.random(m) >= masked
    where[0] = True
    return x, labels, w, jnp.asarray(where)


def reference_vjp(x, labels, w, where, reduction, dout):
    return _reference_vjp(x, labels, w, where, dout, reduction=reduction)


# One program (op by op, each primitive of the reference and its pullback compiled on its
# own for every drawn shape).
@functools.partial(jax.jit, static_argnames="reduction")
def _reference_vjp(x, labels, w, where, dout, *, reduction):
    def f(x, w):
        return cross_entropy_reference(x, labels, w, where, reduction=reduction)

    out, pullback = jax.vjp(f, x.astype(jnp.float32), w.astype(jnp.float32))
    return out, pullback(dout)


def kernel_vjp(cfg, x, labels, w, where, reduction, dout):
    def both(x, w, dout):
        out, pullback = jax.vjp(
            lambda x, w: EX(KERNEL, x, labels, w, where, reduction=reduction, cfg=cfg), x, w
        )
        return out, pullback(dout)

    return jax.jit(both)(x, w, dout)


def cotangent(reduction, m, seed=7):
    if reduction == "none":
        return normal(np.random.default_rng(seed), (m,))
    return jnp.float32(1.7)


def assert_close(got, want, dtype, grad_dtype=None):
    (out, (dx, dw)), (r_out, (r_dx, r_dw)) = got, want
    assert out.dtype == jnp.float32 and out.shape == r_out.shape
    assert relative_error(out, r_out) <= tolerance(dtype)
    assert dx.dtype == dtype and dw.dtype == dtype
    assert relative_error(dx, r_dx) <= 2 * tolerance(dtype)
    assert relative_error(dw, r_dw) <= 2 * tolerance(dtype)


# --- configs and candidates ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "cudnn"}, r"backend must be one of"),
        ({"backend": "xla", "chunk_size": 64}, r"chunk_size is not a field of backend='xla'"),
        ({"backend": "chunked", "block_m": 64}, r"block_m is a field of backend='triton'"),
        ({"backend": "chunked", "chunk_size": 100}, r"chunk_size must be a positive power of two"),
        ({"backend": "triton", "block_v": 8}, r"block_v must be at least 16"),
        ({"backend": "triton", "num_warps": 3}, r"num_warps must be a positive power of two"),
    ],
)
def test_config_is_validated_where_it_is_built(fields, message):
    with pytest.raises(ValueError, match=message):
        CrossEntropyConfig(**fields)


def test_triton_config_fills_its_defaults():
    c = CrossEntropyConfig(backend="triton")
    assert (c.block_m, c.block_v, c.block_k, c.num_warps, c.num_stages) == (64, 128, 64, 4, 2)
    assert c.chunk_size == cc.DEFAULT_CHUNK


def test_gpu_candidates_are_pruned_with_reasons():
    big = cc.CrossEntropyProblem(16384, 2048, 128256, np.dtype("bfloat16"))
    kept, pruned = cc.candidates(big, smem_limit=64 * 1024)
    assert kept[0] == cc.XLA_INPUT_LOGITS  # plain JAX's program always competes
    assert cc.XLA in kept
    assert {c.backend for c in kept} == {"xla", "chunked", "triton"}
    assert any("shared memory" in p.reason for p in pruned)
    assert all(cc.shared_memory_bytes(big, c) <= 64 * 1024 for c in kept if c.backend == "triton")
    small = cc.CrossEntropyProblem(512, 96, 1000, np.dtype("float32"))
    kept, pruned = cc.candidates(small)
    # Every chunk of 512 tokens or more is one chunk: the smallest stands for them.
    assert [c.chunk_size for c in kept if c.backend == "chunked"] == [512]
    assert any(
        "is one chunk of the 512 tokens: the same program as chunk_size=512" in p.reason
        for p in pruned
    )
    assert any("not a multiple of block_k" in p.reason for p in pruned)
    # float32 inputs: 16-bit logits would be the same program
    assert not [c for c in kept if c.logits_dtype == "input"]
    assert any("same program as logits_dtype='float32'" in p.reason for p in pruned)
    training, _ = cc.candidates(big, training=True)
    assert len(training) < len(cc.candidates(big)[0])


def test_chunks_stop_where_their_logits_pass_the_memory_bound():
    # Timed alone, the largest chunk won: one chunk of all 16384 tokens held 8.1 GiB on
    # an H100, half of plain JAX's, where the op exists to hold a fraction of it.
    big = cc.CrossEntropyProblem(16384, 2048, 128256, np.dtype("bfloat16"))

    def chunks(p, dtype):
        kept = cc.candidates(p)[0]
        return [c.chunk_size for c in kept if c.backend == "chunked" and c.logits_dtype == dtype]

    # 16-bit logits: twice the tokens a chunk; and the one chunk of every token.
    assert chunks(big, "input") == [1024, 2048, 16384]
    assert chunks(big, "float32") == [1024, 16384]
    pruned = cc.candidates(big)[1]
    reasons = {
        (p.cfg.chunk_size, p.cfg.logits_dtype): p.reason
        for p in pruned
        if p.cfg.backend == "chunked"
    }
    assert "holds 0.98 GiB of bfloat16 logits" in reasons[4096, "input"]
    assert "holds 0.98 GiB of float32 logits" in reasons[2048, "float32"]
    # A smaller vocabulary takes larger chunks; a huge one keeps the smallest chunk.
    mid = cc.CrossEntropyProblem(8192, 4096, 32000, np.dtype("bfloat16"))
    assert chunks(mid, "float32") == [1024, 2048, 4096, 8192]
    assert chunks(mid, "input") == [1024, 2048, 4096, 8192]  # 8192 is every token
    assert "the same program as chunk_size=8192" in next(
        p.reason for p in cc.candidates(mid)[1] if p.cfg == cc.chunked(16384, "input", "triton")
    )
    huge = cc.CrossEntropyProblem(16384, 1024, 1 << 20, np.dtype("bfloat16"))
    assert chunks(huge, "float32") == [1024, 16384]
    # A call of 10000 tokens is one chunk of 16384 (its tokens, not padded to it).
    odd = cc.CrossEntropyProblem(10000, 2048, 32000, np.dtype("bfloat16"))
    assert cc.one_chunk(odd) == 16384 and chunks(odd, "input")[-1] == 16384


def test_the_heuristic_is_plain_jax_unless_a_gradient_meets_large_logits():
    inv = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache())).invocation(
        LinearSoftmaxCrossEntropy(), *problem(0, 64, 32, 128)[:3], jnp.ones(64, bool)
    )
    # float32 inputs: "input" logits would be float32 ones; the space keeps that name.
    assert LinearSoftmaxCrossEntropy().heuristic_cfg(inv) == cc.XLA
    kernel = LinearSoftmaxCrossEntropyInterpret()
    for dtype in (jnp.float32, BF16):
        x, labels, w, where = problem(0, 64, 32, 128, dtype=dtype)
        inv = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache())).invocation(
            kernel, x, labels, w, where
        )
        assert kernel.heuristic_cfg(inv) in kernel.interpret_candidates(inv)
    f32 = cc.CrossEntropyProblem(32768, 2048, 32000, np.dtype("float32"))
    assert cc.heuristic(f32, training=True) == cc.chunked(4096, "float32")  # 500 MiB
    assert cc.heuristic(f32, training=True) in cc.candidates(f32, training=True)[0]
    wide_f32 = cc.CrossEntropyProblem(16384, 2048, 128256, np.dtype("float32"))
    # 1024-token chunks would be too small: one chunk (no float32 [M, V] gradient).
    assert cc.heuristic(wide_f32, training=True) == cc.chunked(16384, "float32")
    big = cc.CrossEntropyProblem(16384, 2048, 128256, np.dtype("bfloat16"))
    assert cc.heuristic(big) == cc.XLA_INPUT_LOGITS  # forward only: plain JAX's program
    # Under a gradient: the largest chunk within the bound, 16-bit logits.
    assert cc.heuristic(big, training=True) == cc.chunked(2048, "input")
    # Logits of 2 GiB or less: one chunk, the fastest config where timed.
    small = cc.CrossEntropyProblem(8192, 4096, 32000, np.dtype("bfloat16"))
    assert cc.heuristic(small, training=True) == cc.chunked(8192, "input")
    model = cc.CrossEntropyProblem(8192, 2048, 128256, np.dtype("bfloat16"))  # 1.96 GiB
    assert cc.heuristic(model, training=True) == cc.chunked(8192, "input")
    # Large logits, but the chunks that fit are too small to keep plain JAX's speed.
    wide = cc.CrossEntropyProblem(8192, 4096, 256000, np.dtype("bfloat16"))
    assert cc.largest_chunk(wide, "input") == 1024
    assert cc.heuristic(wide, training=True) == cc.chunked(8192, "input")
    # Large logits, but no timed chunk is smaller than the call.
    few = cc.CrossEntropyProblem(1000, 2048, 1 << 20, np.dtype("bfloat16"))
    assert cc.heuristic(few, training=True) == cc.chunked(1024, "input")
    # The heuristic under a gradient is one of the candidates it competes with.
    for p in (big, small, wide, few, wide_f32):
        assert cc.heuristic(p, training=True) in cc.candidates(p, training=True)[0]


def test_a_config_stored_before_logits_dtype_reads_as_float32_logits():
    from kerneltune._src.core.configs import config_from_dict

    old = {"backend": "chunked", "chunk_size": 2048, "block_m": None, "block_v": None}
    assert config_from_dict(old, CrossEntropyConfig) == cc.chunked(2048, "float32")
    # One stored before lse_backend takes XLA's reduction, as it ran then.
    v2 = {"backend": "chunked", "chunk_size": 2048, "logits_dtype": "input"}
    assert config_from_dict(v2, CrossEntropyConfig).lse_backend == "xla"
    # ... and the op's version moved, so an entry of v1 or v2 (tuned without the
    # log-sum-exp kernel in its space) is tuned again, not reused.
    assert LinearSoftmaxCrossEntropy().op_id_v == "linear_softmax_cross_entropy@v3"


@pytest.mark.parametrize("bad", ["bfloat16", "f32", 32])
def test_logits_dtype_is_checked(bad):
    with pytest.raises(ValueError, match=r"logits_dtype must be one of \('float32', 'input'\)"):
        CrossEntropyConfig(backend="chunked", logits_dtype=bad)
    with pytest.raises(ValueError, match=r"logits_dtype is not a field of backend='triton'"):
        CrossEntropyConfig(backend="triton", logits_dtype="input")


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("backend", list(INPUT_LOGITS))
def test_sixteen_bit_logits_stay_within_bfloat16_tolerance(backend, reduction):
    x, labels, w, where = problem(12, 48, 32, 100, dtype=BF16)
    dout = cotangent(reduction, 48)
    got = kernel_vjp(INPUT_LOGITS[backend], x, labels, w, where, reduction, dout)
    assert_close(got, reference_vjp(x, labels, w, where, reduction, dout), BF16)
    # ... and the matmul writes 16-bit logits (the CPU compiler may fold the upcast
    # back into its float32 dot; a GPU's cuBLAS writes them as asked).
    lowered = jax.jit(
        lambda x, w: EX(KERNEL, x, labels, w, where, reduction=reduction, cfg=INPUT_LOGITS[backend])
    ).lower(x, w)
    assert re.search(r"dot_general.*-> tensor<[0-9x]+bf16>", lowered.as_text())


def test_sixteen_bit_logits_of_float32_inputs_are_float32_logits():
    x, labels, w, where = problem(13, 32, 16, 64)
    dout = cotangent("mean", 32)
    got = kernel_vjp(INPUT_LOGITS["chunked"], x, labels, w, where, "mean", dout)
    want = kernel_vjp(CHUNKED, x, labels, w, where, "mean", dout)
    assert float(got[0]) == float(want[0])


# --- values and gradients --------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_values_and_gradients_match_plain_jax(backend, reduction):
    m, k, v = TEST_SHAPES[2]
    x, labels, w, where = problem(1, m, k, v)
    dout = cotangent(reduction, m)
    got = kernel_vjp(BACKENDS[backend], x, labels, w, where, reduction, dout)
    want = reference_vjp(x, labels, w, where, reduction, dout)
    assert_close(got, want, jnp.float32)
    if reduction == "none":
        assert np.all(np.asarray(got[0])[~np.asarray(where)] == 0.0)


@pytest.mark.parametrize("backend", ["chunked", "chunked-lse", "triton"])
def test_bfloat16(backend):
    x, labels, w, where = problem(2, 32, 32, 64, dtype=BF16)
    dout = cotangent("mean", 32)
    got = kernel_vjp(BACKENDS[backend], x, labels, w, where, "mean", dout)
    assert_close(got, reference_vjp(x, labels, w, where, "mean", dout), BF16)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 24),
    v=st.integers(2, 90),
    reduction=st.sampled_from(["mean", "sum", "none"]),
    seed=st.integers(0, 2**16),
)
def test_drawn_shapes_chunked(m, k, v, reduction, seed):
    x, labels, w, where = problem(seed, m, k, v)
    dout = cotangent(reduction, m, seed)
    want = reference_vjp(x, labels, w, where, reduction, dout)
    for cfg in (CHUNKED, CHUNKED_LSE):
        assert_close(kernel_vjp(cfg, x, labels, w, where, reduction, dout), want, jnp.float32)


def test_masked_tokens_are_left_out_whatever_their_labels():
    x, labels, w, where = problem(3, 24, 16, 100, masked=0.5)
    garbage = jnp.where(where, labels, -100)
    for cfg in BACKENDS.values():
        got = EX(KERNEL, x, garbage, w, where, reduction="mean", cfg=cfg)
        kept = np.asarray(where)
        ref = cross_entropy_reference(
            x[kept], labels[kept], w, jnp.ones(int(kept.sum()), bool), reduction="mean"
        )
        assert relative_error(got, ref) <= tolerance(jnp.float32), cfg


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("m", [24, 12], ids=["chunks", "one-chunk"])
def test_labels_out_of_range_get_the_gradient_of_the_loss_they_get(m, reduction):
    # A label outside [0, V) is picked as the reference's clip-mode gather picks it
    # (negative from the end, then clipped), by every backend's forward. Before, the
    # chunked backward (and the fused kernel's, which is the chunked one) compared
    # the raw label with the columns: such a row got the softmax's gradient without
    # the one-hot, not the gradient of the loss it was given.
    x, labels, w, where = problem(5, m, 16, 64, masked=0.0)
    labels = labels.at[:4].set(jnp.array([64, -2, -70, 1000], jnp.int32))
    dout = cotangent(reduction, m)
    want = reference_vjp(x, labels, w, where, reduction, dout)
    for name, cfg in BACKENDS.items():
        got = kernel_vjp(cfg, x, labels, w, where, reduction, dout)
        try:
            assert_close(got, want, jnp.float32)
        except AssertionError as e:
            raise AssertionError(name) from e


# --- the public function: jit, grad, vmap ------------------------------------------------


def test_public_function_under_jit_and_grad():
    x, labels, w, where = problem(4, 32, 32, 64)

    def loss(x, w):
        return linear_softmax_cross_entropy(x, labels, w, where=where, executor=EX)

    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    want = reference_vjp(x, labels, w, where, "mean", jnp.float32(1.0))
    assert_close(got, want, jnp.float32)
    # without a mask every token counts
    plain = linear_softmax_cross_entropy(x, labels, w, reduction="sum", executor=EX)
    ref = cross_entropy_reference(x, labels, w, jnp.ones(32, bool), reduction="sum")
    assert relative_error(plain, ref) <= tolerance(jnp.float32)


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_precision_is_taken_as_tokamax_takes_it(reduction):
    # tokamax's loss head has `precision=None`; a user's call that passes it must run,
    # and a precision given is the projection's.
    x, labels, w, where = problem(12, 24, 16, 40, dtype=BF16)
    dout = cotangent(reduction, 24)
    default = jax.vjp(
        lambda x, w: linear_softmax_cross_entropy(
            x, labels, w, reduction=reduction, where=where, precision=None, executor=EX
        ),
        x,
        w,
    )
    highest = jax.vjp(
        lambda x, w: linear_softmax_cross_entropy(
            x,
            labels,
            w,
            reduction=reduction,
            where=where,
            precision=jax.lax.Precision.HIGHEST,
            executor=EX,
        ),
        x,
        w,
    )
    want = reference_vjp(x, labels, w, where, reduction, dout)
    for out, pullback in (default, highest):
        assert_close((out, pullback(dout)), want, BF16)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_weights_of_another_dtype_are_promoted_as_x_at_w_promotes(reduction):
    # tokamax's loss head takes float32 weights with bfloat16 activations (standard
    # promotion): the loss is that of the promoted inputs, each gradient in its input's
    # dtype.
    x, labels, w, where = problem(13, 20, 16, 40, dtype=BF16)
    w32 = w.astype(jnp.float32) * 1.01  # digits bfloat16 does not hold
    dout = cotangent(reduction, 20)
    with jax.numpy_dtype_promotion("standard"):
        out, pullback = jax.vjp(
            lambda x, w: linear_softmax_cross_entropy(
                x, labels, w, reduction=reduction, where=where, executor=EX
            ),
            x,
            w32,
        )
        dx, dw = pullback(dout)
    (r_out, (r_dx, r_dw)) = reference_vjp(x, labels, w32, where, reduction, dout)
    assert out.dtype == jnp.float32 and dx.dtype == BF16 and dw.dtype == jnp.float32
    assert relative_error(out, r_out) <= tolerance(jnp.float32)
    assert relative_error(dx, r_dx) <= 2 * tolerance(BF16)
    assert relative_error(dw, r_dw) <= 2 * tolerance(jnp.float32)


@pytest.mark.parametrize("cfg", [None, CHUNKED], ids=["heuristic", "chunked"])
def test_vmap_of_values_and_gradients(cfg):
    batch = [problem(10 + i, 16, 8, 32) for i in range(3)]
    xs, ls, ws, wh = (jnp.stack(parts) for parts in zip(*batch))

    def loss(x, labels, w, where):
        return linear_softmax_cross_entropy(x, labels, w, where=where, cfg=cfg, executor=EX)

    out, (dx, dw) = jax.vmap(jax.value_and_grad(loss, argnums=(0, 2)))(xs, ls, ws, wh)
    for i, (x, labels, w, where) in enumerate(batch):
        r_out, (r_dx, r_dw) = reference_vjp(x, labels, w, where, "mean", jnp.float32(1.0))
        assert relative_error(out[i], r_out) <= tolerance(jnp.float32)
        assert relative_error(dx[i], r_dx) <= 2 * tolerance(jnp.float32)
        assert relative_error(dw[i], r_dw) <= 2 * tolerance(jnp.float32)


# --- tuning ---------------------------------------------------------------------------


def test_tuning_validates_every_backend_against_the_reference():
    events: list = []
    ex = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(),
            tuner=kt.Tuner(progress=False, iters=1, target_sample_s=1e-4),
            on_event=lambda e, **d: events.append((e, d)),
        )
    )
    x, labels, w, where = problem(5, 32, 32, 64)
    kernel = LinearSoftmaxCrossEntropyInterpret(executor=ex)
    out = ex(kernel, x, labels, w, where, reduction="mean")
    ref = cross_entropy_reference(x, labels, w, where, reduction="mean")
    assert relative_error(out, ref) <= tolerance(jnp.float32)
    (report,) = [d["report"] for e, d in events if e == "autotune_finish"]
    assert report.validated and not report.failures
    timed = {c.cfg.backend for c in report.candidates}
    assert timed == {"xla", "chunked", "triton"}
    inv = ex.invocation(kernel, x, labels, w, where, reduction="mean")
    assert report.best in kernel.interpret_candidates(inv)


def test_a_training_call_is_keyed_apart():
    ex = heuristics_executor()
    kernel = LinearSoftmaxCrossEntropyInterpret(executor=ex)
    x, labels, w, where = problem(6, 16, 16, 32)
    seen = []

    def loss(x):
        inv = ex.invocation(kernel, x, labels, w, where, reduction="sum")
        seen.append(inv.differentiated)
        return ex(kernel, x, labels, w, where, reduction="sum")

    loss(x)
    jax.grad(loss)(x)
    assert seen == [None, True]


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"labels": jnp.zeros(8, jnp.float32)}, TypeError, r"labels must be an integer array"),
        ({"labels": jnp.zeros(7, jnp.int32)}, ValueError, r"labels must have shape \(8,\)"),
        ({"weights": jnp.ones((5, 16))}, ValueError, r"weights must be \[features, vocab\]"),
        # (strict promotion, as this suite runs: refused as `x @ weights` refuses it)
        ({"weights": jnp.ones((4, 16), BF16)}, jax.dtypes.TypePromotionError, "strict"),
        ({"x": jnp.ones((8, 4), jnp.int32)}, TypeError, r"x and weights must share one floating"),
        ({"x": jnp.ones((2, 4, 4))}, ValueError, r"x must be \[tokens, features\]"),
        ({"reduction": "avg"}, ValueError, r"reduction must be one of \('sum', 'mean', 'none'\)"),
        ({"where": jnp.ones(8, jnp.int32)}, ValueError, r"where must be a boolean array"),
        ({"x": "text"}, TypeError, r"x must be an array"),
    ],
)
def test_bad_input_is_named(change, error, message):
    args = {
        "x": jnp.ones((8, 4)),
        "labels": jnp.zeros(8, jnp.int32),
        "weights": jnp.ones((4, 16)),
        "reduction": "mean",
        "where": None,
    }
    args.update(change)
    with pytest.raises(error, match=message):
        linear_softmax_cross_entropy(
            args["x"],
            args["labels"],
            args["weights"],
            reduction=args["reduction"],
            where=args["where"],
            executor=EX,
        )


@pytest.mark.parametrize("backend", ["chunked", "triton"])
def test_second_derivatives_come_from_the_reference(backend):
    x, labels, w, where = problem(8, 16, 8, 32)

    def grad_norm(loss):
        return lambda x: jnp.sum(jax.grad(loss)(x) ** 2)

    def kernel_loss(x):
        return EX(KERNEL, x, labels, w, where, reduction="sum", cfg=BACKENDS[backend])

    def reference_loss(x):
        return cross_entropy_reference(x, labels, w, where, reduction="sum")

    got = jax.jit(jax.grad(grad_norm(kernel_loss)))(x)
    assert relative_error(got, jax.grad(grad_norm(reference_loss))(x)) <= 1e-4


# --- the chunked path's pieces ----------------------------------------------------------


def lse_passes():
    """Both log-sum-exp passes over written logits: XLA's reduction and the Pallas
    kernel (interpreted, with the tiles the op would take)."""
    from kerneltune.kernels.cross_entropy import lse_triton, lse_xla

    return {
        "xla": lse_xla.lse_and_label_logit,
        "triton": lambda x, labels: lse_triton.lse_and_label_logit(x, labels, interpret=True),
    }


# Both references in one program: one compile per drawn shape, not two.
_logsumexp_and_label_logit = jax.jit(
    lambda x, labels: (
        jax.nn.logsumexp(x, axis=-1),
        jnp.take_along_axis(x, labels[:, None], axis=-1, mode="clip")[:, 0],
    )
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 6),
    cols=st.integers(16, 300),
    scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
    seed=st.integers(0, 2**16),
    backend=st.sampled_from(["xla", "triton"]),
)
def test_one_pass_logsumexp_and_label_logit_equal_xlas(rows, cols, scale, seed, backend):
    rng = np.random.default_rng(seed)
    x = normal(rng, (rows, cols), scale=scale)
    labels = jnp.asarray(rng.integers(-3, cols + 3, rows, dtype=np.int32))
    # Each pass and the reference compiled whole, once per drawn shape (op by op, each of
    # their primitives compiled alone for every draw).
    lse, picked = jax.jit(lse_passes()[backend])(x, labels)
    want_lse, want = _logsumexp_and_label_logit(x, labels)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(picked, want)  # out-of-range labels clipped alike


@pytest.mark.parametrize("backend", ["xla", "triton"])
def test_one_pass_logsumexp_keeps_infinities_and_nans_as_logsumexp(backend):
    # Each pass compiled whole (op by op, each of its primitives compiled alone).
    lse_and_label_logit = jax.jit(lse_passes()[backend])
    # 40 columns: the kernel's one block of 32, then 8 more folded in by XLA.
    x = np.random.default_rng(0).standard_normal((6, 40), np.float32) * np.float32(50)
    x[0] = -np.inf
    x[1, 3], x[2, 5] = np.nan, np.inf
    x[3, :20] = -np.inf  # half a row out of the softmax
    x[4, 36] = np.inf  # +inf past the kernel's block
    x[5, 32:] = -np.inf  # a tail of -inf
    labels = np.arange(6, dtype=np.int32)
    got = lse_and_label_logit(jnp.asarray(x), jnp.asarray(labels))[0]
    want = jax.jit(lambda x: jax.nn.logsumexp(x, axis=-1))(jnp.asarray(x))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-6)
    assert got[0] == -np.inf and got[2] == np.inf and got[4] == np.inf
    # Under vmap too (a batch of chunks).
    batched = jax.jit(jax.vmap(lse_and_label_logit))(
        jnp.asarray(np.stack([x[3:], x[3:]])), jnp.asarray(np.stack([labels[3:]] * 2))
    )
    np.testing.assert_allclose(batched[0][1], got[3:])


def test_the_lse_kernel_reads_16_bit_logits_as_written():
    from kerneltune.kernels.cross_entropy import lse_triton, lse_xla

    x = (jax.random.normal(jax.random.key(1), (8, 2500)) * 4).astype(BF16)
    labels = jax.random.randint(jax.random.key(2), (8,), 0, 2500)
    got = lse_triton.lse_and_label_logit(x, labels, interpret=True)
    want = lse_xla.lse_and_label_logit(x, labels)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    # 2500 columns: one block of 2048 (the default), 452 folded in after.
    assert lse_triton.tiles_for(2500) == lse_triton.DEFAULT_TILES
    assert lse_triton.tiles_for(300).block_v == 256 and lse_triton.tiles_for(15) is None
    with pytest.raises(ValueError, match=r"do not fit the tiles"):
        lse_triton.lse_and_label_logit(x[:, :8], labels, interpret=True)


def test_the_lse_kernel_is_the_gpu_heuristic_where_it_takes_the_vocabulary():
    model = cc.CrossEntropyProblem(8192, 2048, 128256, np.dtype("bfloat16"))
    assert cc.heuristic(model, training=True, lse_backend="triton") == cc.chunked(
        8192, "input", "triton"
    )
    big = cc.CrossEntropyProblem(16384, 2048, 128256, np.dtype("bfloat16"))
    assert cc.heuristic(big, training=True, lse_backend="triton") == cc.chunked(
        2048, "input", "triton"
    )
    # Forward only: the same chunks with the kernel (off GPUs: plain JAX's program).
    assert cc.heuristic(big, lse_backend="triton") == cc.chunked(2048, "input", "triton")
    assert cc.heuristic(model, lse_backend="triton") == cc.chunked(8192, "input", "triton")
    assert cc.heuristic(big) == cc.XLA_INPUT_LOGITS
    for p, training in ((big, False), (big, True), (model, False), (model, True)):
        assert (
            cc.heuristic(p, training=training, lse_backend="triton")
            in cc.candidates(p, training=training)[0]
        )
    # A vocabulary narrower than the kernel's narrowest block: XLA's reduction.
    tiny = cc.CrossEntropyProblem(64, 32, 12, np.dtype("float32"))
    assert cc.heuristic(tiny, training=True, lse_backend="triton").lse_backend == "xla"
    kept, pruned = cc.candidates(tiny, training=True)
    assert all(c.lse_backend == "xla" for c in kept if c.backend == "chunked")
    assert any("narrowest block of 16 columns" in p.reason for p in pruned)
    # Under a gradient the space holds the heuristic's chunks with either pass.
    kept = cc.candidates(model, training=True)[0]
    assert cc.chunked(8192, "input", "triton") in kept and cc.chunked(8192, "input") in kept
    assert not any(c.lse_backend == "xla" and c.chunk_size != 8192 for c in kept if c.chunk_size)
    # The kernel's GPU heuristic takes it; interpreted, XLA's reduction.
    inv = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache())).invocation(
        LinearSoftmaxCrossEntropyInterpret(), *problem(0, 64, 32, 128)[:3], jnp.ones(64, bool)
    )
    assert LinearSoftmaxCrossEntropyInterpret().heuristic_cfg(inv) == cc.XLA
    with pytest.raises(ValueError, match=r"lse_backend must be one of \('xla', 'triton'\)"):
        CrossEntropyConfig(backend="chunked", lse_backend="pallas")
    with pytest.raises(
        ValueError,
        match=r"lse_backend is a field of backend='chunked'; leave it None with backend='xla'",
    ):
        CrossEntropyConfig(backend="xla", lse_backend="triton")


def test_a_chunk_larger_than_the_call_is_one_chunk_not_padding():
    from kerneltune.kernels.cross_entropy.chunked import _in_chunks

    x = jnp.ones((100, 8))
    (one,) = _in_chunks(4096, x)
    assert one.shape == (1, 100, 8)  # was (1, 4096, 8): 40x the work, padded
    assert _in_chunks(32, x)[0].shape == (4, 32, 8)
    # The op at such a config still matches the reference, values and gradients.
    x, labels, w, where = problem(3, 24, 16, 100)
    cfg = cc.chunked(4096)
    dout = jnp.float32(1.0)
    (got, (gx, gw)), (want, (wx, ww)) = (
        kernel_vjp(cfg, x, labels, w, where, "mean", dout),
        reference_vjp(x, labels, w, where, "mean", dout),
    )
    for a, b in ((got, want), (gx, wx), (gw, ww)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("m", [32, 30])  # 30: rows no step count divides, no loop
def test_one_chunk_writes_the_gradient_over_the_logits(m, reduction):
    from kerneltune.kernels.cross_entropy import chunked

    x, labels, w, where = problem(21, m, 16, 100, dtype=BF16)
    dout = cotangent(reduction, m)
    cfg = cc.chunked(
        cc.one_chunk(cc.CrossEntropyProblem(m, 16, 100, np.dtype("bfloat16"))), "input"
    )
    got = kernel_vjp(cfg, x, labels, w, where, reduction, dout)
    assert_close(got, reference_vjp(x, labels, w, where, reduction, dout), BF16)
    # The gradient is a loop over steps of rows whose carry is the 16-bit logits (what
    # lets XLA reuse their buffer), where the steps divide the rows.
    text = (
        jax.jit(
            lambda x, w: chunked.forward_with_grads(
                x, labels, w, where, jnp.ones(m), chunk=cfg.chunk_size, logits_dtype=BF16
            )
        )
        .lower(x, w)
        .as_text()
    )
    carries_logits = re.search(rf"stablehlo.while\(.*tensor<{m}x100xbf16>", text) is not None
    assert carries_logits == (m % chunked.GRADIENT_STEPS == 0)


def test_the_fused_kernel_keeps_an_infinite_logit_as_logsumexp_does():
    # A +inf logit made the fused kernel's sum exp(inf − inf) = NaN; logsumexp is +inf.
    from kerneltune.kernels.cross_entropy import pallas_triton

    x, labels, w, _ = problem(9, 16, 16, 64)
    x = x.at[0, 0].set(jnp.inf)
    w = w.at[0].set(jnp.abs(w[0]) + 0.1)  # row 0's logits all +inf, no inf · 0
    lse, _ = pallas_triton.lse_and_label_logit(x, labels, w, FUSED, interpret=True)
    want = jax.nn.logsumexp(x @ w, axis=-1)
    assert lse[0] == np.inf == want[0]
    np.testing.assert_allclose(lse[1:], want[1:], rtol=1e-5)


def test_one_chunk_is_the_same_config_at_any_length():
    from kerneltune._src.core.configs import config_to_dict
    from kerneltune.kernels.cross_entropy import config as ce_config
    from kerneltune.kernels.cross_entropy.config import CrossEntropyConfig

    one_at_4k = CrossEntropyConfig(backend="chunked", chunk_size=4096, logits_dtype="input")
    # As a cache file holds it: every field.
    one_at_16k = {**config_to_dict(one_at_4k), "chunk_size": 16384}
    here, there = ce_config.across_sizes(one_at_4k, 4096), ce_config.across_sizes(one_at_16k, 16384)
    assert here == there and here["chunk_size"] == ce_config.ONE_CHUNK
    # 4096 tokens are four chunks of a 16384-token call; a call of 3000 tokens is one.
    assert ce_config.across_sizes(one_at_4k, 16384)["chunk_size"] == 4096
    assert ce_config.across_sizes(one_at_4k, 3000)["chunk_size"] == ce_config.ONE_CHUNK
    # The plain-JAX config has no chunk.
    xla = CrossEntropyConfig(backend="xla", logits_dtype="input")
    assert ce_config.across_sizes(xla, 4096)["chunk_size"] is None


def test_a_mean_over_no_token_has_zero_gradients_not_nan():
    # Found by a differential fuzz campaign against plain JAX. With `where` all False the
    # mean is 0/0 (NaN, as jnp.mean's), but plain JAX's gradient of that program is 0:
    # no token reaches it. The backward weighed each row by 1/count = inf: NaN in every
    # entry of d_x and d_W, which an all-padding (micro)batch writes into the weights.
    x = jax.random.normal(jax.random.PRNGKey(0), (6, 4), jnp.float32)
    w = jax.random.normal(jax.random.PRNGKey(1), (4, 9), jnp.float32)
    labels = jnp.array([0, 8, 3, 2, 5, 1], jnp.int32)
    where = jnp.zeros((6,), bool)

    def ours(x, w):
        return linear_softmax_cross_entropy(x, labels, w, reduction="mean", where=where)

    def plain(x, w):
        return cross_entropy_reference(x, labels, w, where, reduction="mean")

    got = jax.grad(ours, argnums=(0, 1))(x, w)
    want = jax.grad(plain, argnums=(0, 1))(x, w)
    for g, r in zip(got, want):
        assert not np.isnan(np.asarray(r)).any()
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))


def test_bf16_per_token_losses_of_one_class_have_zero_gradients():
    # One class: every loss is logsumexp(z) - z = 0 whatever x and w, so the gradient is
    # 0 (plain JAX's bfloat16 program gives 0). With reduction="none" the backward
    # recomputes the logits, and took exp(logit - lse) with the forward's log-sum-exp of
    # logits XLA had kept unrounded (excess precision): up to 0.2.
    x = (jax.random.normal(jax.random.PRNGKey(1), (33, 3)) * 4).astype(jnp.bfloat16)
    w = (jax.random.normal(jax.random.PRNGKey(2), (3, 1)) * 4).astype(jnp.bfloat16)
    labels = jnp.zeros((33,), jnp.int32)

    def ours(x, w):
        return linear_softmax_cross_entropy(x, labels, w, reduction="none").sum()

    for g in jax.grad(ours, argnums=(0, 1))(x, w):
        np.testing.assert_allclose(np.asarray(g, np.float32), 0.0, atol=1e-3)


def test_bf16_per_token_losses_gradients_are_as_accurate_as_plain_jaxs():
    # The same with 16 classes and logits of a few tens: 7x further from the float32
    # gradient than plain JAX's bfloat16 program (`(x @ w).astype(f32)`, logsumexp).
    x = (jax.random.normal(jax.random.PRNGKey(1), (33, 3)) * 4).astype(jnp.bfloat16)
    w = (jax.random.normal(jax.random.PRNGKey(2), (3, 16)) * 4).astype(jnp.bfloat16)
    labels = jax.random.randint(jax.random.PRNGKey(3), (33,), 0, 16)
    where = jnp.ones((33,), bool)

    def ours(x, w):
        return linear_softmax_cross_entropy(x, labels, w, reduction="none").sum()

    def plain(x, w):
        logits = (x @ w).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
        return (jax.nn.logsumexp(logits, axis=-1) - picked).sum()

    def exact(x, w):
        return cross_entropy_reference(x, labels, w, where, reduction="none").sum()

    got = jax.grad(ours, argnums=(0, 1))(x, w)
    bf16 = jax.grad(plain, argnums=(0, 1))(x, w)
    f32 = jax.grad(exact, argnums=(0, 1))(x.astype(jnp.float32), w.astype(jnp.float32))
    for g, b, r in zip(got, bf16, f32):
        r = np.asarray(r)
        ours_err = np.abs(np.asarray(g, np.float32) - r).max()
        plain_err = np.abs(np.asarray(b, np.float32) - r).max()
        assert ours_err <= 2 * plain_err + 1e-3 * np.abs(r).max(), (ours_err, plain_err)


def test_on_a_cpu_a_training_step_is_plain_jaxs_program_up_to_2_gib_of_logits():
    # One chunk, its gradient written over the logits in steps of rows, took 1.05-1.27x
    # plain JAX's training step on a CPU (BENCHMARKS.md, 2026-12-08); plain JAX's
    # program holds what plain JAX holds.
    small = cc.CrossEntropyProblem(512, 1024, 8192, np.dtype("bfloat16"))
    plain = cc.CrossEntropyConfig(backend="xla", logits_dtype="input")
    assert cc.heuristic(small, training=True, pallas=False) == plain
    assert cc.heuristic(small, training=True).backend == "chunked"  # where Pallas runs
    large = cc.CrossEntropyProblem(16384, 2048, 128256, np.dtype("bfloat16"))  # 4 GiB
    assert cc.heuristic(large, training=True, pallas=False).backend == "chunked"
    x, labels, w, where = problem(0, 64, 32, 128, dtype=BF16)
    inv = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache())).invocation(
        LinearSoftmaxCrossEntropy(), x, labels, w, where
    )
    trained = dataclasses.replace(inv, differentiated=True)
    assert LinearSoftmaxCrossEntropy().heuristic_cfg(trained) == plain  # this CPU
