"""Attention: JAX's Pallas mha made tunable, forward and backward tuned separately,
with an XLA path; values and gradients against a float32 reference."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune import BwdParams, FwdParams
from kerneltune._src.core import options
from kerneltune.kernels import (
    Attention,
    AttentionBackward,
    AttentionInterpret,
    VariantConfig,
    attention,
)
from kerneltune.kernels._common import on_gpu, relative_error, tolerance
from kerneltune.kernels.attention import config as ac
from kerneltune.kernels.attention import tokamax_backend as tb
from kerneltune.kernels.attention.reference import attention_reference
from kerneltune.kernels.attention.shapes import TEST_SHAPES
from tests.helpers import host_rng, normal, value_and_grads

BF16 = jnp.bfloat16


def qkv(key, b, t, h, d, dtype=jnp.float32):
    rng = host_rng(key)
    q, k, v, do = (normal(rng, (b, t, h, d), dtype) for _ in range(4))
    return q, k, v, do


def executor(events=None, policy=None):
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=policy or kt.AutotunePolicy(cache_miss_fallback="heuristics"),
        tuner=kt.Tuner(progress=False),
        on_event=None if events is None else (lambda e, **d: events.append((e, d))),
    )
    return kt.Executor(chain)


def reference_value_and_grads(q, k, v, do, causal):
    f32 = [a.astype(jnp.float32) for a in (q, k, v)]
    return value_and_grads(
        lambda *a: attention_reference(*a, causal=causal), f32, do.astype(jnp.float32)
    )


def assert_matches(out, grads, ref, ref_grads, dtype):
    assert relative_error(out, ref) <= tolerance(dtype)
    for g, r in zip(grads, ref_grads):
        assert relative_error(g, r) <= 2 * tolerance(dtype)


# --- configs ------------------------------------------------------------------------


def test_heuristics_are_jax_defaults():
    p = ac.AttentionProblem(2, 2048, 2048, 8, 64, np.dtype(BF16), True)
    assert ac.fwd_heuristic(p) == FwdParams(
        q_blocksize=128, kv_blocksize=128, num_warps=4, num_stages=2
    )
    assert ac.fwd_heuristic(dataclasses.replace(p, head_dim=128)).num_warps == 8
    assert ac.bwd_heuristic(p) == BwdParams(q_blocksize=32, kv_blocksize=32, num_warps=4)
    short = dataclasses.replace(p, q_len=64, kv_len=64)
    assert ac.fwd_heuristic(short).q_blocksize == 64


def test_candidate_spaces_are_pruned_with_reasons():
    p = ac.AttentionProblem(4, 4096, 4096, 16, 128, np.dtype(BF16), True)
    fwd, fwd_pruned = ac.fwd_candidates(p)
    bwd, bwd_pruned = ac.bwd_candidates(p)
    assert ac.fwd_heuristic(p) in fwd and ac.bwd_heuristic(p) in bwd
    for c in fwd:
        if c.backend == "pallas":
            assert ac.fwd_shared_memory_bytes(p, c) <= 227 * 1024
    assert all(x.reason for x in fwd_pruned + bwd_pruned)
    # The library backends are candidates too: XLA always, cuDNN only on GPUs.
    assert FwdParams(backend="xla") in fwd
    cudnn = [x.reason for x in fwd_pruned if x.cfg.backend == "cudnn"]
    if on_gpu():
        assert cudnn == [] and ac.CUDNN in fwd
    else:
        assert cudnn == ["cuDNN attention runs on NVIDIA GPUs only"]
    # tokamax's kernel joins where tokamax is installed and the GPU is a Hopper.
    why_not = tb.unsupported(np.dtype(BF16), 128)
    tokamax = [x.reason for x in fwd_pruned if x.cfg.backend == "tokamax"]
    if why_not is None:
        assert tokamax == [] and ac.TOKAMAX in fwd
    else:
        assert tokamax == [why_not]
        assert "not installed" in why_not or "Hopper" in why_not
    odd = dataclasses.replace(p, q_len=96, kv_len=96)
    _, pruned = ac.fwd_candidates(odd)
    assert any("not a multiple of" in x.reason for x in pruned)


def test_the_tokamax_backend_says_why_it_cannot_run(monkeypatch):

    monkeypatch.setattr(tb, "installed", lambda: False)
    assert tb.unsupported(np.dtype(BF16), 128) == "tokamax is not installed (pip install tokamax)"
    monkeypatch.setattr(tb, "installed", lambda: True)
    monkeypatch.setattr(tb, "on_gpu", lambda: True)
    monkeypatch.setattr(tb, "is_hopper", lambda: False)
    assert "Hopper" in tb.unsupported(np.dtype(BF16), 128)
    monkeypatch.setattr(tb, "is_hopper", lambda: True)
    assert tb.unsupported(np.dtype(BF16), 128) is None
    assert tb.unsupported(np.dtype("float16"), 64) is None
    assert "not float32" in tb.unsupported(np.dtype("float32"), 128)
    assert "not 96" in tb.unsupported(np.dtype(BF16), 96)


@pytest.mark.skipif(on_gpu(), reason="what a CPU refuses (test_gpu_heuristics.py: a GPU's)")
def test_a_tokamax_config_is_refused_where_tokamax_cannot_run(monkeypatch):
    # A config tuned on a machine with tokamax (a shared cache) names it; here, the
    # kernel's hook says why it cannot run, so the stored tiers miss and an explicit
    # cfg= fails with that reason instead of an ImportError deep in a trace.
    import kerneltune as kt
    from kerneltune._src.kernel import hooks

    monkeypatch.setattr(tb, "installed", lambda: False)
    kernel = Attention()
    q = jnp.zeros((1, 128, 2, 64), BF16)
    inv = kt.default_executor().invocation(kernel, q, q, q, causal=True)
    tokamax = FwdParams(backend="tokamax")
    assert "not installed" in kernel.backend_named("tokamax").unusable(kernel, inv, tokamax)
    cudnn = FwdParams(backend="cudnn")
    assert "NVIDIA GPUs" in kernel.backend_named("cudnn").unusable(kernel, inv, cudnn)
    # On this CPU the XLA fallback runs whatever the config names: nothing to refuse.
    assert hooks.unusable_reason(kernel, inv, tokamax) is None


def test_the_backend_is_part_of_the_config_and_round_trips():
    import kerneltune as kt

    for backend in ("cudnn", "tokamax"):
        cfg = FwdParams(backend=backend)
        assert kt.from_json(kt.to_json(cfg), FwdParams) == cfg
        assert cfg != FwdParams(backend="xla")
    with pytest.raises(ValueError, match=r"FwdParams.backend must be one of .*'tpu'"):
        FwdParams(backend="tpu")


# --- the XLA path -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", TEST_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_xla_path_values_and_gradients(key, shape, dtype):
    *dims, causal = shape
    q, k, v, do = qkv(key, *dims, dtype=dtype)
    ex = executor()
    out, grads = value_and_grads(
        lambda *a: attention(*a, is_causal=causal, executor=ex), (q, k, v), do
    )
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert_matches(out, grads, *reference_value_and_grads(q, k, v, do, causal), dtype)


def test_gradients_go_through_the_backward_kernel(key):
    # Where the flash kernel runs (here the Pallas interpreter for it).
    events: list = []
    ex = executor(events)
    q, k, v, do = qkv(key, 1, 32, 2, 16)
    with options.scoped(platform="triton"):
        value_and_grads(lambda *a: attention(*a, is_causal=True, executor=ex), (q, k, v), do)
    ops = {d["op_id"] for _, d in events}
    assert ops == {"attention@v1", "attention_bwd@v1"}


def test_where_no_flash_kernel_runs_plain_attention_is_the_variants_xla_code(key):
    # On a CPU the flash kernel's XLA fallback (blocks of 256 queries, every key head
    # repeated for its group, a backward of its own) took 1.3-1.7x jax.nn's time at 512
    # tokens and 2.4x the variants' blocks in training at 1024 (BENCHMARKS.md,
    # 2026-12-08): plain calls run the variants' XLA code there, which JAX
    # differentiates, forward mode included.
    events: list = []
    ex = executor(events)
    q, k, v, do = qkv(key, 1, 32, 2, 16)
    f = lambda *a: attention(*a, is_causal=True, executor=ex)  # noqa: E731
    out, grads = value_and_grads(f, (q, k, v), do)
    assert {d["op_id"] for _, d in events} == {"attention_variants@v1"}
    assert_matches(out, grads, *reference_value_and_grads(q, k, v, do, True), jnp.float32)
    _, tangent = jax.jvp(f, (q, k, v), (do, jnp.zeros_like(k), jnp.zeros_like(v)))
    plain = lambda *a: jax.nn.dot_product_attention(*a, is_causal=True)  # noqa: E731
    _, want = jax.jvp(plain, (q, k, v), (do, jnp.zeros_like(k), jnp.zeros_like(v)))
    assert relative_error(tangent, want) <= 1e-5


def test_sm_scale_and_causal_are_part_of_the_key(key):
    q, k, v, _ = qkv(key, 1, 16, 1, 8)
    kernel = Attention()
    inv = {}
    for causal in (False, True):
        for scale in (None, 0.5):
            args, kwargs = kernel.prepare(q, k, v, causal=causal, sm_scale=scale)
            inv[(causal, scale)] = kt.Invocation(
                op_id="attention", args=args, kwargs=kwargs
            ).call_key
    assert len(set(inv.values())) == 4
    out = attention(q, k, v, scale=0.5, executor=executor())
    ref = attention_reference(q, k, v, sm_scale=0.5)
    assert relative_error(out, ref) <= tolerance(jnp.float32)


# --- the Pallas kernel in the interpreter -------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_pallas_values_and_gradients(key, causal):
    q, k, v, do = qkv(key, 1, 64, 2, 16)
    ex = executor()
    kernel = AttentionInterpret(executor=ex)
    cfg = FwdParams(q_blocksize=32, kv_blocksize=32, num_warps=4, num_stages=2)
    out, grads = value_and_grads(lambda *a: ex(kernel, *a, causal=causal, cfg=cfg), (q, k, v), do)
    assert_matches(out, grads, *reference_value_and_grads(q, k, v, do, causal), jnp.float32)


def test_pallas_bf16_forward(key):
    q, k, v, _ = qkv(key, 1, 64, 1, 32, dtype=BF16)
    out = executor()(AttentionInterpret(), q, k, v, causal=True)
    assert out.dtype == BF16
    assert relative_error(out, attention_reference(q, k, v, causal=True)) <= tolerance(BF16)


# --- separate tuning of the two passes ---------------------------------------------


class _TwoFwd(Attention):
    """Two forward configs to tune on this CPU (where the fallback runs them)."""

    op_id = "attention-test"

    def candidate_cfgs(self, inv):
        return [
            FwdParams(q_blocksize=16, kv_blocksize=16, num_warps=4, num_stages=1),
            self.heuristic_cfg(inv),
        ]

    @functools.cached_property
    def backward(self):
        return _TwoBwd(executor=self.executor)


class _TwoBwd(AttentionBackward):
    op_id = "attention_bwd-test"

    def candidate_cfgs(self, inv):
        return [BwdParams(q_blocksize=16, kv_blocksize=16, num_warps=4), self.heuristic_cfg(inv)]


def test_forward_and_backward_are_tuned_separately_under_jit(key):
    events: list = []
    ex = executor(events, policy=kt.AutotunePolicy())
    q, k, v, do = qkv(key, 1, 32, 2, 16)
    out, grads = value_and_grads(
        lambda *a: ex(_TwoFwd(executor=ex), *a, causal=True), (q, k, v), do
    )
    assert_matches(out, grads, *reference_value_and_grads(q, k, v, do, True), jnp.float32)
    tuned = {d["op_id"]: d["report"] for e, d in events if e == "autotune_finish"}
    assert set(tuned) == {"attention-test@v1", "attention_bwd-test@v1"}
    assert isinstance(tuned["attention-test@v1"].best, FwdParams)
    assert isinstance(tuned["attention_bwd-test@v1"].best, BwdParams)
    # The backward was tuned while traced: on inputs from tuning_inputs, validated.
    assert tuned["attention_bwd-test@v1"].validated


@jax.default_matmul_precision("highest")  # a GPU's float32 dots are TF32 otherwise
def test_backward_tuning_inputs_are_consistent_residuals(key):
    kernel = AttentionBackward()
    q, k, v, _ = qkv(key, 1, 32, 2, 16)
    lse = jax.ShapeDtypeStruct((1, 2, 32), jnp.float32)
    args, kwargs = kernel.prepare(q, k, v, q, lse, q, causal=True)
    inv = kt.Invocation(op_id=kernel.op_id, args=args, kwargs=kwargs)
    (tq, tk, tv, out, tlse, dout), kw = kernel.tuning_inputs(inv)
    assert not bool(jnp.all(dout == 0))
    ref = attention_reference(tq, tk, tv, causal=True, sm_scale=kw["sm_scale"])
    assert relative_error(out, ref) <= 1e-5
    assert tlse.shape == (1, 2, 32) and tlse.dtype == jnp.float32


@pytest.mark.parametrize(
    "shapes",
    [((1, 16, 2, 8), (1, 16, 2, 4), (1, 16, 2, 4)), ((2, 16, 2, 8), (16, 2, 8), (16, 2, 8))],
)
def test_bad_shapes_are_rejected(shapes):
    arrays = [jnp.ones(s) for s in shapes]
    with pytest.raises(ValueError, match="attention"):
        attention(*arrays, executor=executor())


def test_default_scale_is_inverse_sqrt_head_dim(key):
    q, k, v, _ = qkv(key, 1, 16, 1, 64)
    _, kwargs = Attention().prepare(q, k, v)
    assert kwargs["sm_scale"] == pytest.approx(1 / math.sqrt(64))


# --- grouped-query attention ----------------------------------------------------------


def grouped_qkv(key, dtype=jnp.float32):
    rng = host_rng(key)
    q = normal(rng, (1, 32, 4, 16), dtype)
    k, v = (normal(rng, (1, 32, 2, 16), dtype) for _ in range(2))
    do = normal(rng, q.shape, dtype)
    return q, k, v, do


def grouped_reference(q, k, v, do, causal):
    def ref(q, k, v):
        k, v = jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)
        return attention_reference(q, k, v, causal=causal)

    return value_and_grads(ref, [a.astype(jnp.float32) for a in (q, k, v)], do)


def test_grouped_kv_reach_the_kernel_unrepeated(key):
    # Before: the op repeated k and v for every query head, so cuDNN (which takes
    # grouped heads natively) read 2x the data and its backward summed them back.
    from kerneltune._src.kernel import recording

    q, k, v, _ = grouped_qkv(key)
    recording.clear_invocations()
    with recording.record_calls():
        attention(q, k, v, executor=executor())
        with options.scoped(platform="triton"):  # the flash kernel's call
            attention(q, k, v, executor=executor())
    records = recording.iter_records(recording.get_invocations())
    recording.clear_invocations()
    assert sorted(r.op_id_v for r in records) == ["attention@v1", "attention_variants@v1"]
    for record in records:
        assert [tuple(a.shape) for a in record.args[:3]] == [q.shape, k.shape, v.shape]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("interpret", [False, True], ids=["xla", "pallas-interpret"])
def test_grouped_query_values_and_gradients(key, causal, interpret):
    q, k, v, do = grouped_qkv(key)
    ex = executor()
    if interpret:
        kernel = AttentionInterpret(executor=ex)
        cfg = FwdParams(q_blocksize=16, kv_blocksize=16, num_warps=4, num_stages=2)

        def fn(*a):
            return ex(kernel, *a, causal=causal, cfg=cfg)
    else:

        def fn(*a):
            return attention(*a, is_causal=causal, executor=ex)

    out, grads = value_and_grads(fn, (q, k, v), do)
    assert grads[1].shape == k.shape and grads[2].shape == v.shape
    assert_matches(out, grads, *grouped_reference(q, k, v, do, causal), jnp.float32)


@pytest.mark.parametrize("kv_spec", [("data", None, "model"), ("data",)])
@pytest.mark.parametrize("chunked", [False, True], ids=["plain", "chunked-variant"])
def test_grouped_query_attention_runs_on_an_explicitly_sharded_mesh(key, kv_spec, chunked):
    # Before: under `jax.set_mesh` of explicit axes, k and v (plain attention) or v's
    # mean (the chunked variants' fully masked rows) repeated for every query head by
    # `jnp.repeat` raised "Please pass sharding to `jnp.repeat`" where
    # jax.nn.dot_product_attention runs, values and gradients, heads sharded or not.
    explicit = jax.sharding.AxisType.Explicit
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(explicit, explicit))
    q, k, v, _ = qkv(key, 2, 16, 4, 8)
    k, v = k[:, :, :2], v[:, :, :2]
    variant = {"local_window_size": 3} if chunked else {}
    cfg = VariantConfig(block_q=8) if chunked else None

    def loss(f, **kw):
        call = functools.partial(f, is_causal=True, **variant, **kw)
        return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(call(*a) ** 2), (0, 1, 2)))

    with jax.set_mesh(mesh):
        spec = jax.sharding.PartitionSpec(*kv_spec)
        q, k, v = (jax.device_put(a, spec) for a in (q, k, v))
        ours = loss(attention, cfg=cfg, executor=executor())(q, k, v)
        theirs = loss(jax.nn.dot_product_attention)(q, k, v)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)


def test_the_backward_kernel_still_wants_every_head(key):
    q, k, v, do = grouped_qkv(key)
    with pytest.raises(ValueError, match="kv_heads q's heads"):
        AttentionBackward().prepare(q, k, v, q, jnp.zeros((1, 4, 32)), do)


def test_under_a_gradient_the_pallas_path_is_one_candidate_or_none(monkeypatch):
    p = ac.AttentionProblem(2, 1024, 1024, 8, 64, np.dtype(BF16), True)
    monkeypatch.setattr(ac, "cudnn_unsupported", lambda p: "as on a CPU")
    monkeypatch.setattr(tb, "installed", lambda: False)
    kept, pruned = ac.fwd_candidates(p)
    train, train_pruned = ac.for_training(p, kept, pruned)
    assert [c for c in train if c.backend == "pallas"] == [ac.fwd_heuristic(p)]
    assert FwdParams(backend="xla") in train
    assert len(train_pruned) == len(pruned) + len(kept) - len(train)
    monkeypatch.setattr(ac, "cudnn_unsupported", lambda p: None)  # as on a GPU
    gpu_kept = [ac.CUDNN, ac.TOKAMAX, *kept]
    train, train_pruned = ac.for_training(p, gpu_kept, pruned)
    # cuDNN alone: tokamax's training step never beat it (0.87-0.99x), and timing it
    # cost 18 s and 4x plain JAX's memory at 32k tokens.
    assert train == [ac.CUDNN]
    assert any(x.cfg == ac.TOKAMAX and "cuDNN runs this call" in x.reason for x in train_pruned)


@pytest.mark.parametrize("causal", [False, True])
@jax.default_matmul_precision("highest")  # a GPU's float32 dots are TF32 otherwise
def test_the_chunked_reference_matches_the_whole_one_in_values_and_gradients(causal):
    # Long sequences validate against the reference a chunk of queries at a time (at
    # T=128k the whole float32 score matrix is 1 TiB): same values, same gradients.
    from kerneltune.kernels.attention.reference import (
        attention_forward_chunked,
        attention_forward_xla,
    )

    q, k, v, do = qkv(jax.random.PRNGKey(3), 2, 48, 2, 16)
    scale = 0.25
    # 2·2·48 float32 scores per query row: 768 bytes, so 12 rows (4 chunks) fit in 9216.
    whole = lambda q, k, v: attention_forward_xla(q, k, v, causal=causal, sm_scale=scale)[0]  # noqa: E731

    def chunked(q, k, v):
        return attention_forward_chunked(q, k, v, causal=causal, sm_scale=scale, score_bytes=9216)

    def odd(q, k, v):
        return attention_forward_chunked(
            q, k, v, causal=causal, sm_scale=scale, score_bytes=768 * 7
        )

    def value_and_grads(f):
        # The value and the gradients in one compiled program (op by op, every
        # primitive compiles alone).
        def both(q, k, v, do):
            out, pullback = jax.vjp(f, q, k, v)
            return out, pullback(do)

        return jax.jit(both)(q, k, v, do)

    assert "scan[" in jax.make_jaxpr(chunked)(q, k, v).pretty_print()  # it is chunked
    (got, got_grads), (want, want_grads) = (value_and_grads(f) for f in (chunked, whole))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    # Rows that do not divide the sequence: the last chunk is padded, then cut away.
    np.testing.assert_allclose(jax.jit(odd)(q, k, v), want, rtol=1e-5, atol=1e-5)


def test_a_forward_longer_than_any_measured_times_the_libraries_and_default_blocks(monkeypatch):
    monkeypatch.setattr(ac, "cudnn_unsupported", lambda p: None)  # as on a GPU
    long = ac.AttentionProblem(1, 131072, 131072, 16, 128, np.dtype(BF16), True)
    kept, pruned = ac.fwd_candidates(long)
    assert len(kept) > 10  # the full block search
    out, out_pruned = ac.for_long_sequences(long, kept, pruned)
    assert out == [ac.CUDNN, ac.TOKAMAX, ac.fwd_heuristic(long)] or out == [
        ac.CUDNN,
        ac.fwd_heuristic(long),
    ]
    assert FwdParams(backend="xla") not in out
    assert any("131072 tokens" in x.reason for x in out_pruned)
    # At a measured length the search is whole.
    short = ac.AttentionProblem(2, 8192, 8192, 16, 128, np.dtype(BF16), True)
    kept, pruned = ac.fwd_candidates(short)
    assert ac.for_long_sequences(short, kept, pruned) == (kept, pruned)


def test_a_long_causal_forward_alone_runs_tokamax_and_times_nothing_else(monkeypatch):
    # On H100s and H200s tokamax's causal forward took 0.91-0.97x cuDNN's at 8k-32k
    # tokens with head dim 128, but the H100 table (tuned without tokamax) predicted
    # cuDNN: the forward read 0.92-0.96x the best peer's.
    monkeypatch.setattr(ac, "cudnn_unsupported", lambda p: None)  # as on a Hopper GPU
    monkeypatch.setattr(tb, "unsupported", lambda dtype, head_dim: None)  # tokamax there
    long = ac.AttentionProblem(1, 16384, 16384, 16, 128, np.dtype(BF16), True)
    assert ac.gpu_heuristic(long) == ac.TOKAMAX
    kept, pruned = ac.fwd_candidates(long)
    out, out_pruned = ac.for_tokamax_causal_forward(long, kept, pruned)
    assert out == [ac.TOKAMAX]
    assert {x.cfg for x in out_pruned} >= {ac.CUDNN, FwdParams(backend="xla")}
    assert any("runs tokamax" in x.reason for x in out_pruned)
    # The kernel's search space for such a call, and for it under a gradient.
    q = jax.ShapeDtypeStruct((1, 16384, 16, 128), BF16)
    args, kwargs = Attention().prepare(q, q, q, causal=True)
    inv = kt.Invocation(op_id="attention", args=args, kwargs=kwargs)
    assert Attention().search_space(inv)[0] == [ac.TOKAMAX]
    trained = dataclasses.replace(inv, differentiated=True)
    assert Attention().search_space(trained)[0] == [ac.CUDNN]
    assert ac.gpu_heuristic(long, differentiated=True) == ac.CUDNN
    # Elsewhere cuDNN stays: without the causal mask, with head dim 64, below 8k
    # tokens (queries or keys), and where tokamax does not run.
    for other in (
        dataclasses.replace(long, causal=False),
        dataclasses.replace(long, head_dim=64),
        dataclasses.replace(long, q_len=4096, kv_len=4096),
        dataclasses.replace(long, q_len=1),
    ):
        assert not ac.tokamax_causal_forward(other, differentiated=False)
        assert ac.gpu_heuristic(other) == ac.CUDNN
    at_8k = dataclasses.replace(long, q_len=8192, kv_len=8192)
    assert ac.tokamax_causal_forward(at_8k, differentiated=False)
    monkeypatch.setattr(tb, "unsupported", lambda dtype, head_dim: "not installed")
    assert ac.gpu_heuristic(long) == ac.CUDNN
    kept, pruned = ac.fwd_candidates(long)
    assert ac.TOKAMAX not in kept
    assert ac.for_tokamax_causal_forward(long, kept, pruned) == (kept, pruned)


@pytest.mark.parametrize("head_dim", [64, 256])
def test_tokamax_differentiated_runs_cudnn_where_cudnn_takes_the_call(monkeypatch, key, head_dim):
    # tokamax is chosen for its forward; a training call hidden from kerneltune (under
    # jax.checkpoint, keyed as a forward) would otherwise run tokamax's backward, whose
    # training step took 1.11-1.14x cuDNN's (H100). Stand-ins tell the two apart: the
    # "tokamax" forward is twice the attention, so its values and gradients differ.
    def reference(q, k, v, *, causal, sm_scale):
        return attention_reference(q, k, v, causal=causal, sm_scale=sm_scale)

    def doubled(q, k, v, *, causal, sm_scale):
        return 2 * reference(q, k, v, causal=causal, sm_scale=sm_scale)

    monkeypatch.setattr(tb, "attention", doubled)
    monkeypatch.setattr(tb, "cudnn_attention", reference)
    rng = host_rng(key)
    q, k, v = (normal(rng, (1, 16, 2, head_dim), BF16) for _ in range(3))
    backend = tb.TokamaxBackend()

    def run(q, k, v):
        return backend.run(None, q, k, v, cfg=ac.TOKAMAX, causal=True, sm_scale=0.125)

    def loss(f):
        return lambda q: jnp.sum(f(q, k, v).astype(jnp.float32) ** 2)

    want_fast = doubled(q, k, v, causal=True, sm_scale=0.125)
    np.testing.assert_array_equal(jax.jit(run)(q, k, v), want_fast)  # evaluated: tokamax
    cudnn_takes_it = head_dim <= 128  # cuDNN takes head dims up to 128
    expect = reference if cudnn_takes_it else doubled
    want_grad = jax.grad(loss(lambda q, k, v: expect(q, k, v, causal=True, sm_scale=0.125)))(q)
    for got in (
        jax.grad(loss(run))(q),
        jax.grad(loss(jax.checkpoint(run)))(q),  # training hidden from kerneltune
        jax.grad(loss(jax.jit(run)))(q),
    ):
        np.testing.assert_allclose(
            got.astype(np.float32), want_grad.astype(np.float32), rtol=2e-2, atol=2e-2
        )


# --- unequal lengths in the fused backward -------------------------------------------


@jax.default_matmul_precision("highest")  # a GPU's float32 dots are TF32 otherwise
def test_unequal_lengths_take_a_backward_that_splits_them_alike():
    # JAX's fused backward cuts queries and keys with one outer block and needs as
    # many blocks of each: 32 queries and 16 keys used to fail ("q_seq_len and
    # kv_seq_len must be divided into the same number of blocks").
    key = jax.random.PRNGKey(3)
    q = jax.random.normal(key, (1, 32, 2, 16))
    k, v = (jax.random.normal(jax.random.fold_in(key, i), (1, 16, 2, 16)) for i in (1, 2))
    ex = executor()
    kernel = AttentionInterpret(executor=ex)

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a) ** 2)

    def ours(q, k, v):
        return ex(kernel, q, k, v, causal=False)

    def ref(q, k, v):
        return attention_reference(q, k, v, causal=False, sm_scale=1 / math.sqrt(16))

    got = jax.jit(jax.grad(loss(ours), (0, 1, 2)))(q, k, v)
    for g, r in zip(got, jax.grad(loss(ref), (0, 1, 2))(q, k, v), strict=True):
        assert relative_error(g, r) <= 1e-4

    short = ac.AttentionProblem(1, 32, 16, 2, 16, np.dtype("float32"), causal=False)
    heuristic = ac.bwd_heuristic(short)
    assert heuristic.backend == "pallas" and ac.bwd_splits_alike(32, 16, heuristic)
    long = dataclasses.replace(short, q_len=4096, kv_len=1024)
    assert ac.bwd_heuristic(long) == ac.BWD_XLA
    kept, pruned = ac.bwd_candidates(long)
    assert kept == [ac.BWD_XLA] and any("different numbers of blocks" in p.reason for p in pruned)


# --- long sequences through XLA ------------------------------------------------------


def test_plain_attention_on_a_cpu_compiles_to_under_a_quarter_of_the_whole_scores():
    """Issue 44: a CPU call at long context does not materialise the scores. Plain
    attention (no variant) ran XLA with the whole `[B, N, T, S]` float32 scores, forward
    and backward: at T 8192 it compiled to 2x and 3x what `jax.nn` holds of them."""
    t, n, h = 8192, 2, 16
    q = jax.ShapeDtypeStruct((1, t, n, h), jnp.float32)

    def temp_bytes(fn):
        return jax.jit(fn).lower(q, q, q).compile().memory_analysis().temp_size_in_bytes

    def ours(q, k, v):
        return attention(q, k, v, is_causal=True, executor=executor())

    def whole(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")

    for make in (lambda f: f, lambda f: jax.grad(lambda *a: f(*a).sum(), (0, 1, 2))):
        assert temp_bytes(make(ours)) < temp_bytes(make(whole)) / 4


@pytest.mark.parametrize("t,s", [(40, 48), (33, 17)])
@pytest.mark.parametrize("causal", [False, True])
@jax.default_matmul_precision("highest")  # a GPU's float32 dots are TF32 otherwise
def test_the_xla_forward_and_backward_a_block_of_queries_at_a_time(t, s, causal):
    """Blocks of 16 queries, the last one short: the same output, log-sum-exp and
    gradients as one block of every query."""
    from kerneltune.kernels.attention.reference import (
        attention_backward_xla,
        attention_forward_xla,
    )

    rng = host_rng(jax.random.PRNGKey(5))
    q, dout = (normal(rng, (2, t, 2, 16), jnp.float32) for _ in range(2))
    k, v = (normal(rng, (2, s, 2, 16), jnp.float32) for _ in range(2))
    kw = dict(causal=causal, sm_scale=0.25)

    def both(block_q):
        out, lse = attention_forward_xla(q, k, v, block_q=block_q, **kw)
        return out, lse, attention_backward_xla(q, k, v, out, lse, dout, block_q=block_q, **kw)

    (out, lse, grads), (want, want_lse, want_grads) = (
        jax.jit(both, static_argnums=0)(b) for b in (16, t)
    )
    assert "scan[" in jax.make_jaxpr(lambda: both(16))().pretty_print()  # it is blocked
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
