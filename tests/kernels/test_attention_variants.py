"""Attention variants (bias, mask, padding, window, soft cap, segment ids) through
`AttentionVariants`: the chunked path against the whole-logits reference, segment ids
against the equivalent mask in `jax.nn`, bad input, the memory the chunked path
compiles to, and which backend a call gets."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kerneltune._src.kernel.base import Invocation
from kerneltune.kernels import attention
from kerneltune.kernels.attention.chunked import attention_chunked, key_band
from kerneltune.kernels.attention.features import attention_features_xla
from kerneltune.kernels.attention.masking import Masks
from kerneltune.kernels.attention.variants import AttentionVariants, VariantConfig
from tests.helpers import close, heuristics_executor, rand

EX = heuristics_executor()
B, T, S, N, K, H = 2, 40, 48, 4, 2, 8


def _qkv(seed=0, t=T, s=S):
    return (
        rand((B, t, N, H), seed=seed),
        rand((B, s, K, H), seed=seed + 1),
        rand((B, s, K, H), seed=seed + 2),
    )


def _documents(lengths, total):
    ids = np.repeat(np.arange(len(lengths)), lengths)
    assert ids.size == total
    return ids


Q_DOCS = jnp.asarray(np.stack([_documents([20, 20], T), _documents([10, 30], T)]))
KV_DOCS = jnp.asarray(np.stack([_documents([24, 24], S), _documents([12, 36], S)]))

VARIANTS = {
    "window": dict(causal=False, window=(5, 3), soft_cap=None, parts=()),
    "causal+window+segments": dict(causal=True, window=(6, 0), soft_cap=None, parts=("segments",)),
    "soft_cap+bias+lengths": dict(
        causal=True, window=None, soft_cap=10.0, parts=("bias", "lengths")
    ),
    "mask+segments+window": dict(
        causal=False, window=(4, 4), soft_cap=5.0, parts=("mask", "segments")
    ),
    "everything": dict(
        causal=True, window=(7, 2), soft_cap=3.0, parts=("bias", "mask", "lengths", "segments")
    ),
}


def _call_parts(parts):
    bias = rand((1, N, T, S), seed=7) if "bias" in parts else None
    masks = Masks(
        mask=jax.random.bernoulli(jax.random.key(3), 0.8, (B, 1, T, S))
        if "mask" in parts
        else None,
        q_lengths=jnp.array([30, 40], jnp.int32) if "lengths" in parts else None,
        kv_lengths=jnp.array([48, 20], jnp.int32) if "lengths" in parts else None,
        q_segments=Q_DOCS if "segments" in parts else None,
        kv_segments=KV_DOCS if "segments" in parts else None,
    )
    return bias, masks


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("block_q", [8])
@jax.default_matmul_precision("highest")  # a GPU's float32 dots are TF32 otherwise
def test_the_chunked_path_matches_the_whole_logits_in_values_and_gradients(name, block_q):
    v_ = VARIANTS[name]
    bias, masks = _call_parts(v_["parts"])
    q, k, v = _qkv()
    kw = dict(causal=v_["causal"], window=v_["window"], soft_cap=v_["soft_cap"])

    def chunked(q, k, v, bias):
        return attention_chunked(q, k, v, bias, masks, scale=0.3, block_q=block_q, **kw)

    def whole(q, k, v, bias):
        return attention_features_xla(
            q, k, v, bias, masks, scale=0.3, is_causal=kw["causal"],
            local_window_size=kw["window"], logits_soft_cap=kw["soft_cap"],
        )  # fmt: skip

    argnums = (0, 1, 2, 3) if bias is not None else (0, 1, 2)
    w = rand((B, T, N, H), seed=11)
    # Each side's value and gradient in one program (op by op, every primitive compiles
    # alone; a program for the value and another for the gradient compile it twice).
    (out_chunked, grads_chunked), (out_whole, grads_whole) = (
        jax.jit(lambda *a, f=f: (f(*a), jax.grad(lambda *a: (f(*a) * w).sum(), argnums)(*a)))(
            q, k, v, bias
        )
        for f in (chunked, whole)
    )
    close(out_chunked, out_whole, tol=1e-5)
    for got, want in zip(grads_chunked, grads_whole):
        close(got, want, tol=1e-4)


def test_a_window_band_holds_only_the_keys_a_block_can_see():
    assert key_band(4096, 128, None, True) == 4096
    assert key_band(4096, 128, (256, 64), False) == 128 + 256 + 64
    assert key_band(4096, 128, (256, 64), True) == 128 + 256  # causal: nothing to the right
    assert key_band(300, 128, (256, 64), False) == 300


def _dense_segment_mask(q_ids, kv_ids):
    return (q_ids[:, :, None] == kv_ids[:, None, :])[:, None]


@pytest.mark.parametrize(
    "causal,window,cap", [(True, None, None), (False, (6, 3), None), (True, None, 20.0)]
)
def test_segment_ids_equal_jax_nn_with_the_equivalent_mask(causal, window, cap):
    q, k, v = _qkv(seed=20, s=T)
    ids = Q_DOCS
    kwargs = dict(is_causal=causal, local_window_size=window)

    def ours(q, k, v):
        return attention(q, k, v, query_segment_ids=ids, kv_segment_ids=ids,
                         logits_soft_cap=cap, executor=EX, **kwargs)  # fmt: skip

    def theirs(q, k, v):
        mask = _dense_segment_mask(ids, ids)
        if cap is None:
            return jax.nn.dot_product_attention(q, k, v, mask=mask, **kwargs)
        return attention_features_xla(
            q, k, v, None, Masks(mask=mask), scale=1 / np.sqrt(H), is_causal=causal,
            local_window_size=window, logits_soft_cap=cap,
        )  # fmt: skip

    close(jax.jit(ours)(q, k, v), jax.jit(theirs)(q, k, v), tol=1e-5)
    w = rand(q.shape, seed=5)
    got = jax.jit(jax.grad(lambda *a: (ours(*a) * w).sum(), (0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(lambda *a: (theirs(*a) * w).sum(), (0, 1, 2)))(q, k, v)
    for g, e in zip(got, want):
        close(g, e, tol=1e-4)


def test_unbatched_segment_ids_and_vmap_over_the_batch():
    q, k, v = _qkv(seed=30, s=T)
    ids = Q_DOCS

    def one(q, k, v, ids):
        return attention(
            q, k, v, is_causal=True, query_segment_ids=ids, kv_segment_ids=ids, executor=EX
        )

    batched = one(q, k, v, ids)
    close(jax.vmap(one)(q, k, v, ids), batched, tol=1e-5)
    close(one(q[1], k[1], v[1], ids[1]), batched[1], tol=1e-5)


def _plain_reference(q, k, v, bias, keep, scale, cap, q_lengths):
    """Attention in float32 jnp with every head's keys, written apart from the library:
    `keep` the `[B, N, T, S]` logits that take part."""
    n = q.shape[2]
    k, v = (jnp.repeat(x, n // x.shape[2], axis=2) for x in (k, v))
    logits = jnp.einsum("btnh,bsnh->bnts", q, k, precision="highest") * scale + bias
    if cap is not None:
        logits = cap * jnp.tanh(logits / cap)
    logits = jnp.where(keep, logits, -0.7 * np.finfo(np.float32).max)
    out = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(logits), v, precision="highest")
    return jnp.where((jnp.arange(q.shape[1]) < q_lengths[:, None])[..., None, None], out, 0)


@st.composite
def _drawn_calls(draw):
    """Odd lengths (one query, one key, just past a chunk of 8), grouped heads, a bias
    and a mask of drawn broadcast shapes, lengths down to 0, unsorted segment ids."""
    b, t, s = (
        draw(st.sampled_from([1, 2])),
        draw(st.sampled_from([1, 9, 17])),
        draw(st.sampled_from([1, 8, 9, 19])),
    )
    kh, groups = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 3]))
    n = kh * groups
    dims = st.tuples(*(st.sampled_from([1, d]) for d in (b, n, t, s)))
    return dict(
        shape=(b, t, s, n, kh), causal=draw(st.booleans()),
        window=draw(st.sampled_from([None, 0, (2, 0), (1, 5)])),
        cap=draw(st.sampled_from([None, 2.0])), bias=draw(st.none() | dims),
        mask=draw(st.none() | dims), lengths=draw(st.booleans()), segments=draw(st.booleans()),
        block_q=draw(st.sampled_from([None, 8])), vmapped=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip


@settings(
    max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(_drawn_calls())
@example(  # everything at once, a chunk of 8 queries, each call unbatched under vmap
    dict(shape=(2, 17, 19, 6, 2), causal=True, window=(1, 5), cap=2.0, bias=(2, 6, 17, 1),
         mask=(1, 1, 17, 19), lengths=True, segments=True, block_q=8, vmapped=True, seed=5)
)  # fmt: skip
@jax.default_matmul_precision("highest")  # a GPU's float32 dots are TF32 otherwise
def test_drawn_combinations_match_a_plain_reference_in_values_and_gradients(call):
    """Issue 44's CPU line: every variant and combination, values and gradients (query,
    key, value and bias) against a reference of its own, under jit, grad and vmap (of an
    unbatched call over a leading axis), the chunked path at lengths its block does not
    divide."""
    (b, t, s, n, kh), seed = call["shape"], call["seed"]
    rng = np.random.default_rng(seed)
    q, k, v = (
        rand((b, t, n, 8), seed=seed),
        rand((b, s, kh, 8), seed=seed + 1),
        rand((b, s, kh, 8), seed=seed + 2),
    )
    w = rand((b, t, n, 8), seed=seed + 3)
    vmapped = call["vmapped"]
    # Under vmap every argument is mapped over the batch, so bias and mask have it.
    bias = (
        None
        if call["bias"] is None
        else rand((b, *call["bias"][1:]) if vmapped else call["bias"], seed=seed + 4)
    )
    mask = (
        None
        if call["mask"] is None
        else jnp.asarray(rng.random((b, *call["mask"][1:]) if vmapped else call["mask"]) < 0.7)
    )
    q_len = jnp.asarray(rng.integers(0, t + 1, b), jnp.int32) if call["lengths"] else None
    kv_len = jnp.asarray(rng.integers(0, s + 1, b), jnp.int32) if call["lengths"] else None
    q_ids = jnp.asarray(rng.integers(0, 3, (b, t)), jnp.int32) if call["segments"] else None
    kv_ids = jnp.asarray(rng.integers(0, 3, (b, s)), jnp.int32) if call["segments"] else None
    cfg = None if call["block_q"] is None else VariantConfig(block_q=call["block_q"])
    static = dict(
        is_causal=call["causal"], local_window_size=call["window"], logits_soft_cap=call["cap"]
    )
    if not (
        bias is not None
        or mask is not None
        or call["lengths"]
        or call["segments"]
        or call["window"] is not None
        or call["cap"]
    ):
        cfg = None  # plain attention takes no VariantConfig

    def ours(q, k, v, bias, mask, q_len, kv_len, q_ids, kv_ids):
        return attention(
            q,
            k,
            v,
            bias,
            mask,
            query_seq_lengths=q_len,
            key_value_seq_lengths=kv_len,
            query_segment_ids=q_ids,
            kv_segment_ids=kv_ids,
            cfg=cfg,
            executor=EX,
            **static,
        )

    if vmapped:  # each call unbatched: its lengths are [1], its ids [T] and [S]
        one = ours

        def ours(q, k, v, bias, mask, q_len, kv_len, q_ids, kv_ids):
            lens = [None if x is None else x[:, None] for x in (q_len, kv_len)]
            return jax.vmap(one)(q, k, v, bias, mask, *lens, q_ids, kv_ids)

    def reference(q, k, v, bias, mask, q_len, kv_len, q_ids, kv_ids):
        i, j = jnp.arange(t)[:, None], jnp.arange(s)[None, :]
        keep = jnp.ones((b, n, t, s), bool)
        if mask is not None:
            keep &= mask
        if call["causal"]:
            keep &= i >= j
        if call["window"] is not None:
            left, right = (
                (call["window"],) * 2 if isinstance(call["window"], int) else call["window"]
            )
            keep &= (i <= j + left) & (i >= j - right)
        if q_len is not None:
            keep &= (i < q_len[:, None, None, None]) & (j < kv_len[:, None, None, None])
        if q_ids is not None:
            keep &= (q_ids[:, :, None] == kv_ids[:, None, :])[:, None]
        q_len = jnp.full((b,), t) if q_len is None else q_len
        return _plain_reference(
            q, k, v, 0.0 if bias is None else bias, keep, 8**-0.5, call["cap"], q_len
        )

    args = (q, k, v, bias, mask, q_len, kv_len, q_ids, kv_ids)
    wrt = (0, 1, 2, 3) if bias is not None else (0, 1, 2)
    (got, got_grads), (want, want_grads) = (
        jax.jit(lambda *a, f=f: (f(*a), jax.grad(lambda *a: (f(*a) * w).sum(), wrt)(*a)))(*args)
        for f in (ours, reference)
    )
    assert not np.isnan(np.asarray(got)).any()
    close(got, want, tol=1e-5)
    for g, e in zip(got_grads, want_grads, strict=True):
        close(g, e, tol=1e-4)


def test_a_window_wider_than_the_sequence_is_no_window_as_in_jax_nn():
    q, k, v = _qkv(seed=40, s=T)
    got = attention(q, k, v, local_window_size=(10 * T, 10 * T), executor=EX)
    close(got, jax.nn.dot_product_attention(q, k, v), tol=1e-5)
    # Past int32 too: positions plus such a reach overflowed ("An overflow was
    # encountered while parsing an argument to a jitted computation").
    got = attention(q, k, v, local_window_size=(2**33, 2**31), executor=EX)
    close(got, jax.nn.dot_product_attention(q, k, v), tol=1e-5)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(query_segment_ids=Q_DOCS), ValueError, "both query_segment_ids and kv_segment_ids"),
        (dict(query_segment_ids=Q_DOCS[:, :10], kv_segment_ids=KV_DOCS), ValueError,
         r"query_segment_ids must be an integer array of shape \(2, 40\), got int32\[2, 10\]"),
        (dict(query_segment_ids=Q_DOCS, kv_segment_ids=KV_DOCS.astype(jnp.float32)), ValueError,
         r"kv_segment_ids must be an integer array of shape \(2, 48\), got float32"),
        (dict(logits_soft_cap=0.0), ValueError, "logits_soft_cap must be a positive finite number"),
        (dict(logits_soft_cap=-3), ValueError, "logits_soft_cap must be a positive finite number"),
        (dict(logits_soft_cap=True), ValueError, "logits_soft_cap must be a positive finite number"),
        # An infinite cap gave NaNs everywhere (inf · tanh(x / inf) = inf · 0).
        (dict(logits_soft_cap=float("inf")), ValueError, "logits_soft_cap must be a positive finite"),
        (dict(local_window_size=(1, 2, 3)), ValueError, "local_window_size must be an int or a pair"),
        # A negative side runs as jax.nn, which has no soft cap.
        (dict(local_window_size=(-1, 2), logits_soft_cap=2.0), ValueError,
         r"runs as jax\.nn\.dot_product_attention, which takes no logits_soft_cap"),
    ],
)  # fmt: skip
def test_bad_variant_arguments_are_named(kwargs, error, match):
    q, k, v = _qkv()
    with pytest.raises(error, match=match):
        attention(q, k, v, executor=EX, **kwargs)


def test_a_numpy_soft_cap_is_taken_as_a_python_one():
    """A cap read from a NumPy array or a config (np.float32(30.0)) was refused as "not
    a positive number"."""
    q, k, v = _qkv(seed=41, s=T)
    want = attention(q, k, v, is_causal=True, logits_soft_cap=30.0, executor=EX)
    for cap in (np.float32(30.0), np.int64(30)):
        got = attention(q, k, v, is_causal=True, logits_soft_cap=cap, executor=EX)
        np.testing.assert_array_equal(got, want)


def _temp_bytes(fn, *shapes):
    compiled = jax.jit(fn).lower(*shapes).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_the_chunked_path_compiles_to_under_a_quarter_of_the_whole_logits_memory():
    """T 8192: the whole float32 logits are 2 heads × 8192² × 4 B = 512 MiB; a block of
    512 queries holds 32 MiB of them (forward and a training step)."""
    t, n, h = 8192, 2, 16
    q = jax.ShapeDtypeStruct((1, t, n, h), jnp.float32)
    masks = Masks(q_lengths=jnp.array([t - 100], jnp.int32))

    def whole(q, k, v):
        return attention_features_xla(q, k, v, None, masks, scale=0.25, is_causal=True,
                                      local_window_size=None, logits_soft_cap=30.0)  # fmt: skip

    def chunked(q, k, v):
        return attention_chunked(q, k, v, None, masks, scale=0.25, causal=True, window=None,
                                 soft_cap=30.0, block_q=512)  # fmt: skip

    for make in (lambda f: f, lambda f: jax.grad(lambda *a: f(*a).sum(), (0, 1, 2))):
        assert _temp_bytes(make(chunked), q, q, q) < _temp_bytes(make(whole), q, q, q) / 4


def _inv(t, s, *, soft_cap=None, parts=(), window=None, dtype=jnp.float32, n=N):
    q = jax.ShapeDtypeStruct((1, t, n, 128), dtype)
    k = jax.ShapeDtypeStruct((1, s, 2, 128), dtype)
    masks = Masks(
        mask=jax.ShapeDtypeStruct((1, 1, t, s), bool) if "mask" in parts else None,
        q_segments=jax.ShapeDtypeStruct((1, t), jnp.int32) if "segments" in parts else None,
        kv_segments=jax.ShapeDtypeStruct((1, s), jnp.int32) if "segments" in parts else None,
        q_lengths=jax.ShapeDtypeStruct((1,), jnp.int32) if "lengths" in parts else None,
    )
    kwargs = dict(causal=True, sm_scale=0.1, window=window, soft_cap=soft_cap)
    return Invocation(op_id="attention_variants", args=(q, k, k, None, masks), kwargs=kwargs)


def test_on_a_cpu_small_calls_take_the_whole_logits_and_long_ones_the_chunked_path():
    kernel = AttentionVariants()
    assert kernel.heuristic_cfg(_inv(256, 256)) == VariantConfig(backend="xla")
    long = kernel.heuristic_cfg(_inv(16384, 16384, soft_cap=50.0))
    assert long.backend == "chunked"
    assert 4 * N * long.block_q * 16384 <= 1 << 28  # one block's logits within budget


def test_on_a_cpu_calls_past_8_mib_of_logits_take_blocks_of_128_queries():
    # The whole logits (or blocks of 512-1024 queries) leave a CPU's caches: blocks of
    # 128 took 0.35-0.6x their training step, and grouped-query training 0.5x already
    # at 8 MiB of logits (BENCHMARKS.md, 2026-12-08).
    kernel = AttentionVariants()

    def chosen(t, n, differentiated, kv_heads=2):
        q = jax.ShapeDtypeStruct((1, t, n, 128), jnp.float32)
        k = jax.ShapeDtypeStruct((1, t, kv_heads, 128), jnp.float32)
        inv = Invocation(
            op_id="attention_variants",
            args=(q, k, k, None, Masks()),
            kwargs=dict(causal=True, sm_scale=0.1, window=None, soft_cap=None),
            differentiated=differentiated,
        )
        return kernel.heuristic_cfg(inv)

    blocks = VariantConfig(backend="chunked", block_q=128)
    whole = VariantConfig(backend="xla")
    assert chosen(1024, 8, True) == blocks
    assert chosen(1024, 8, False) == blocks
    assert chosen(1024, 8, True, kv_heads=8) == blocks
    assert chosen(512, 8, True) == blocks  # grouped-query training
    assert chosen(512, 8, True, kv_heads=8) == whole  # 8 MiB of logits
    assert chosen(512, 8, False) == whole
    assert chosen(512, 16, False) == blocks  # 16 MiB
    assert chosen(128, 8, True) == whole  # one block: the same
    # Past 4 MiB a block (8 heads x 2048 keys x 128 queries) blocks of 64: 0.63x the
    # training step of blocks of 128 with 8 key heads.
    assert chosen(2048, 8, True, kv_heads=8) == VariantConfig(backend="chunked", block_q=64)
    assert chosen(8192, 64, True).block_q == 32  # no fewer


def test_on_a_gpu_the_libraries_are_chosen_for_what_they_take(monkeypatch):
    from kerneltune.kernels.attention import jax_nn, tokamax_backend

    monkeypatch.setattr(jax_nn, "on_gpu", lambda: True)
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: None)
    kernel = AttentionVariants()
    bf16 = jnp.bfloat16
    assert kernel.heuristic_cfg(_inv(4096, 4096, window=(512, 0), dtype=bf16)).backend == "cudnn"
    assert kernel.heuristic_cfg(_inv(4096, 4096, soft_cap=50.0, dtype=bf16)).backend == "tokamax"
    assert (
        kernel.heuristic_cfg(_inv(4096, 4096, parts=("segments",), dtype=bf16)).backend == "tokamax"
    )
    for parts, backend in ((("mask",), "tokamax"), (("lengths",), "cudnn")):
        assert kernel.heuristic_cfg(_inv(4096, 4096, parts=parts, dtype=bf16)).backend == backend
    cudnn = kernel.backend_named("cudnn")
    why = cudnn.unusable(kernel, _inv(64, 64, soft_cap=5.0, dtype=bf16), None)
    assert why == "cuDNN's attention has no logits soft cap"
    why = cudnn.unusable(kernel, _inv(64, 64, window=(4, 4), dtype=bf16), None)
    assert why is None  # causal: the right reach is moot
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: "not installed")
    assert kernel.heuristic_cfg(_inv(4096, 4096, soft_cap=50.0, dtype=bf16)).backend == "chunked"


@pytest.mark.parametrize(
    "feature, long_tokens, reason",
    [
        # tokamax's forward measured 5-7% faster than cuDNN's with padding at 16k tokens
        # (H200), 1-7% slower at 8k; its training step 3-4x slower.
        ("lengths", 16384, "with lengths; cuDNN's forward measured 1.05"),
        # With a window of 4096: 2-3% faster at 32k (H100, H200), 8% slower at 16k; its
        # training step 2.4-7.5x slower.
        ("window", 32768, "with a window; cuDNN's forward measured 1.02"),
    ],
)
def test_a_long_causal_forward_with_lengths_or_a_window_goes_to_tokamax_and_training_to_cudnn(
    monkeypatch, feature, long_tokens, reason
):
    """Shorter calls, calls with both features, non-causal calls and training keep
    cuDNN, and without tokamax the long forward does too."""
    from kerneltune.kernels.attention import jax_nn, tokamax_backend

    monkeypatch.setattr(jax_nn, "on_gpu", lambda: True)
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: None)
    kernel = AttentionVariants()
    kw = dict(parts=("lengths",)) if feature == "lengths" else dict(window=(4096, 0))
    long = _inv(long_tokens, long_tokens, dtype=jnp.bfloat16, **kw)
    assert kernel.heuristic_cfg(long).backend == "tokamax"
    assert kernel.heuristic_cfg(dataclasses.replace(long, differentiated=True)).backend == "cudnn"
    shorter = _inv(long_tokens // 2, long_tokens // 2, dtype=jnp.bfloat16, **kw)
    assert kernel.heuristic_cfg(shorter).backend == "cudnn"
    both = _inv(32768, 32768, parts=("lengths",), window=(4096, 0), dtype=jnp.bfloat16)
    assert kernel.heuristic_cfg(both).backend == "cudnn"
    both_ways = dataclasses.replace(long, kwargs={**long.kwargs, "causal": False})
    assert kernel.heuristic_cfg(both_ways).backend == "cudnn"
    kept, pruned = kernel.search_space(long)
    assert kept == [VariantConfig(backend="tokamax")]
    assert {p.cfg.backend: p.reason for p in pruned}["cudnn"].startswith(
        "tokamax runs this long causal forward " + reason
    )
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: "not installed")
    assert kernel.heuristic_cfg(long).backend == "cudnn"
    kept, pruned = kernel.search_space(long)
    assert kept == [VariantConfig(backend="cudnn")]
    assert all(not p.reason.startswith("tokamax runs") for p in pruned)


@pytest.mark.parametrize(
    "parts, window, soft_cap, trained_by",
    [
        ((), (6, 0), None, "cudnn"),  # a window alone
        (("lengths",), None, None, "cudnn"),  # sequence lengths alone
        (("lengths",), (6, 0), None, "cudnn"),
        (("bias",), None, None, "tokamax"),  # tokamax's step was the faster with a bias
        ((), (6, 0), 20.0, "tokamax"),  # cuDNN has no soft cap
    ],
)
def test_a_differentiated_tokamax_call_with_a_window_or_lengths_alone_runs_cudnn(
    monkeypatch, parts, window, soft_cap, trained_by
):
    """tokamax runs long windowed or padded causal forwards; a training call hidden from
    kerneltune (a `jax.checkpoint`, keyed as a forward) would otherwise run tokamax's
    backward, 2.4-7.5x cuDNN's step. Stand-ins tell the two apart: the "tokamax"
    forward is twice the attention, so its values and gradients differ."""
    from kerneltune.kernels.attention import tokamax_backend

    def reference(q, k, v, bias, masks, *, causal, sm_scale, window, soft_cap=None):
        return attention_features_xla(
            q, k, v, bias, masks, scale=sm_scale, is_causal=causal, local_window_size=window,
            logits_soft_cap=soft_cap,
        )  # fmt: skip

    class FakeTokamax:
        @staticmethod
        def dot_product_attention(q, k, v, bias, mask, *, scale, is_causal, query_seq_lengths,
                                  key_value_seq_lengths, local_window_size, logits_soft_cap,
                                  implementation):  # fmt: skip
            masks = Masks(mask=mask, q_lengths=query_seq_lengths, kv_lengths=key_value_seq_lengths)
            return 2 * reference(
                q, k, v, bias, masks, causal=is_causal, sm_scale=scale, window=local_window_size,
                soft_cap=logits_soft_cap,
            )  # fmt: skip

    class Importer:
        @staticmethod
        def import_module(name):
            assert name == "tokamax"
            return FakeTokamax

    monkeypatch.setattr(tokamax_backend, "importlib", Importer)
    monkeypatch.setattr(tokamax_backend, "cudnn_variant", reference)
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(5, s=T))
    bias = rand((1, N, T, T), seed=9).astype(jnp.bfloat16) if "bias" in parts else None
    lengths = jnp.asarray([30, 22], jnp.int32) if "lengths" in parts else None
    masks = Masks(q_lengths=lengths, kv_lengths=lengths)
    kw = dict(causal=True, sm_scale=0.3, window=window, soft_cap=soft_cap)

    def ours(q):
        return tokamax_backend.attention_variant(q, k, v, bias, masks, **kw)

    def expected(q):
        out = reference(q, k, v, bias, masks, **kw)
        return out if trained_by == "cudnn" else 2 * out

    def loss(f):
        return lambda q: jnp.sum(f(q).astype(jnp.float32) ** 2)

    want = jax.grad(loss(expected))(q).astype(jnp.float32)
    np.testing.assert_array_equal(jax.jit(ours)(q), 2 * reference(q, k, v, bias, masks, **kw))
    for got in (jax.grad(loss(ours))(q), jax.grad(loss(jax.checkpoint(ours)))(q)):
        np.testing.assert_allclose(got.astype(jnp.float32), want, rtol=2e-2, atol=2e-2)


def test_the_search_space_leaves_out_whole_logits_too_large_with_the_reason():
    kept, pruned = AttentionVariants().search_space(_inv(32768, 32768, n=16))
    assert VariantConfig(backend="xla") not in kept
    assert any(p.cfg.backend == "xla" and "GiB" in p.reason for p in pruned)
    assert {c.backend for c in kept} == {"chunked"}


def test_whole_logits_only_where_the_sequence_is_one_block():
    """SPEC §8c: a variant never holds the [B, N, T, S] logits. 4096 queries of one head
    (64 MiB of logits) were once "small" and taken whole on a CPU, and whole logits up
    to 2 GiB were a tuning candidate."""
    kernel = AttentionVariants()
    one_head = _inv(4096, 4096, n=1, soft_cap=30.0)
    assert kernel.heuristic_cfg(one_head).backend == "chunked"
    kept, pruned = kernel.search_space(_inv(4096, 4096, n=16, soft_cap=30.0))
    assert VariantConfig(backend="xla") not in kept
    assert any(p.cfg.backend == "xla" and "one block" in p.reason for p in pruned)
    assert VariantConfig(backend="xla") in kernel.search_space(_inv(1024, 4096, n=1))[0]


def test_a_soft_capped_call_compiles_to_less_than_its_whole_logits():
    b, t, n, d = 1, 4096, 1, 32
    q, k, v = (
        jax.random.normal(s, (b, t, n, d), jnp.float32)
        for s in jax.random.split(jax.random.key(0), 3)
    )
    whole = 4 * b * n * t * t

    def call(q, k, v):
        return attention(q, k, v, is_causal=True, logits_soft_cap=30.0, executor=EX)

    temp = jax.jit(call).lower(q, k, v).compile().memory_analysis().temp_size_in_bytes
    assert temp < whole


def test_where_a_library_runs_the_call_only_the_heuristic_library_is_a_candidate(monkeypatch):
    from kerneltune.kernels.attention import jax_nn, tokamax_backend

    monkeypatch.setattr(jax_nn, "on_gpu", lambda: True)
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: "not installed")
    kernel = AttentionVariants()
    monkeypatch.setattr(kernel, "runs_pallas", lambda: True)
    kept, pruned = kernel.search_space(_inv(8192, 8192, window=(512, 0), dtype=jnp.bfloat16))
    assert kept == [VariantConfig(backend="cudnn")]
    assert {p.cfg.backend for p in pruned} == {
        "tokamax", "cudnn_packed", "mosaic", "xla", "chunked"
    }  # fmt: skip
    assert all("cudnn runs this variant" in p.reason for p in pruned)
    # Both libraries run it: the one the heuristic picks for the variant alone.
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: None)
    kept, _ = kernel.search_space(_inv(8192, 8192, window=(512, 0), dtype=jnp.bfloat16))
    assert kept == [VariantConfig(backend="cudnn")]
    kept, _ = kernel.search_space(_inv(8192, 8192, parts=("segments",), dtype=jnp.bfloat16))
    assert kept == [VariantConfig(backend="tokamax")]
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: "not installed")
    # A soft cap without tokamax: nothing but XLA's chunked path runs it (8192 queries
    # are more than one block: never the whole logits).
    kept, _ = kernel.search_space(_inv(8192, 8192, soft_cap=30.0, dtype=jnp.bfloat16))
    assert {c.backend for c in kept} == {"chunked"}


def test_on_a_hopper_gpu_kerneltunes_mosaic_kernel_takes_what_the_libraries_run_worse(
    monkeypatch,
):
    from kerneltune.kernels.attention import jax_nn, tokamax_backend

    monkeypatch.setattr(jax_nn, "on_gpu", lambda: True)
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: "not installed")
    kernel = AttentionVariants()
    monkeypatch.setattr(kernel, "runs_pallas", lambda: True)
    monkeypatch.setattr(kernel, "mosaic_runs", lambda inv: True)
    mosaic = VariantConfig(backend="mosaic")
    # A soft cap without tokamax: the kernel, alone (XLA's paths pruned with the reason).
    capped = _inv(8192, 8192, soft_cap=30.0, dtype=jnp.bfloat16)
    assert kernel.heuristic_cfg(capped) == mosaic
    kept, pruned = kernel.search_space(capped)
    assert kept == [mosaic] and all("Mosaic kernel runs" in p.reason for p in pruned)
    # Packed documents below the packed layout's length: the kernel skips other
    # documents' blocks, in training and in the forward alone.
    docs = _inv(4096, 4096, parts=("segments",), dtype=jnp.bfloat16)
    assert kernel.heuristic_cfg(dataclasses.replace(docs, differentiated=True)) == mosaic
    assert kernel.heuristic_cfg(docs) == mosaic
    # A window, padding: cuDNN stays.
    window = _inv(8192, 8192, window=(512, 0), dtype=jnp.bfloat16)
    assert kernel.heuristic_cfg(dataclasses.replace(window, differentiated=True)) == VariantConfig(
        backend="cudnn"
    )


def test_the_mosaic_kernel_is_never_chosen_in_the_interpreter():
    kernel = AttentionVariants(interpret=True)
    capped = _inv(256, 256, soft_cap=30.0, dtype=jnp.bfloat16)
    assert not kernel.mosaic_runs(capped)
    assert kernel.heuristic_cfg(capped).backend != "mosaic"


def test_traced_calls_are_tuned_on_even_documents_and_full_lengths():
    inv = _inv(64, 48, parts=("segments", "lengths", "mask"))
    (q, _, _, _, masks), _ = AttentionVariants().tuning_inputs(inv)
    assert isinstance(q, jax.Array) and q.shape == (1, 64, N, 128)
    assert np.asarray(masks.q_segments)[0].tolist() == [i * 4 // 64 for i in range(64)]
    assert np.asarray(masks.kv_segments).max() == 3
    assert np.asarray(masks.q_lengths).tolist() == [64]
    assert bool(np.asarray(masks.mask).all())


def test_a_variant_config_names_its_fields():
    assert VariantConfig(backend="chunked").block_q == 512
    with pytest.raises(ValueError, match="block_q must be a positive power of two, got 100"):
        VariantConfig(backend="chunked", block_q=100)
    # block_q belongs to two backends (chunked, mosaic): the message names the one used.
    with pytest.raises(ValueError, match="block_q is not a field of backend='cudnn'"):
        VariantConfig(backend="cudnn", block_q=128)


def test_16_bit_inputs_and_bias_under_strict_dtype_promotion():
    """Seen on an H200: the shared block math promoted bf16 against float32, which the
    strict promotion users (and these tests) set refuses."""
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(seed=50, s=T))
    bias = rand((1, N, T, T), seed=51).astype(jnp.bfloat16)
    with jax.numpy_dtype_promotion("strict"):
        got = attention(q, k, v, bias, is_causal=True, logits_soft_cap=5.0, executor=EX)
    f32 = [x.astype(jnp.float32) for x in (q, k, v, bias)]
    want = attention_features_xla(
        *f32[:3], f32[3], Masks(), scale=1 / np.sqrt(H), is_causal=True,
        local_window_size=None, logits_soft_cap=5.0,
    )  # fmt: skip
    assert got.dtype == jnp.bfloat16
    close(got, want, tol=3e-2)


def test_document_ranges_hold_exactly_the_keys_of_a_query_s_document_when_packed_in_order():
    from kerneltune.kernels.attention.masking import document_ranges

    rng = np.random.default_rng(0)
    packed = np.sort(rng.integers(0, 5, (3, 40)), axis=1)  # documents one after another
    shuffled = rng.integers(0, 5, (2, 40))
    shuffled[:, :2] = [1, 0]  # goes down at least once
    assert document_ranges(Masks()) is None
    for ids, in_order in ((packed, True), (shuffled, False)):
        q_ids = np.concatenate([ids[:, :30], np.full((len(ids), 1), 7)], axis=1)  # 7: no key
        start, end = document_ranges(
            Masks(q_segments=jnp.asarray(q_ids), kv_segments=jnp.asarray(ids))
        )
        assert start.shape == end.shape == (len(ids), 1, 31) and start.dtype == jnp.int32
        cols = np.arange(40)
        in_range = (cols >= np.asarray(start)[:, 0, :, None]) & (
            cols < np.asarray(end)[:, 0, :, None]
        )
        same = q_ids[:, :, None] == ids[:, None, :]
        if in_order:
            np.testing.assert_array_equal(in_range, same)  # the range is the document
        else:
            assert in_range.all()  # every key: the ids decide as a mask


def test_forward_only_runs_the_fast_program_unless_differentiated():
    from kerneltune.kernels.attention.forward_only import forward_only

    # `fast` carries a marker (exp) that neither `full` nor its derivative has.
    def fast(x, b, masks):
        return jnp.sin(x) * b + masks.q_lengths.sum().astype(x.dtype) + 0 * jnp.exp(x)

    def full(x, b, masks):
        return jnp.sin(x) * b + masks.q_lengths.sum().astype(x.dtype)

    f = forward_only(fast, full)
    x, masks = jnp.linspace(0.0, 2.0, 6), Masks(q_lengths=jnp.array([1, 2], jnp.int32))
    close(jax.jit(f)(x, 2.0, masks), full(x, 2.0, masks), tol=1e-6)
    assert "exp" in str(jax.make_jaxpr(f)(x, 2.0, masks))
    loss = lambda x, b: f(x, b, masks).sum()  # noqa: E731
    assert "exp" not in str(jax.make_jaxpr(jax.grad(loss))(x, 2.0))
    dx, db = jax.jit(jax.grad(loss, (0, 1)))(x, 2.0)
    close(dx, 2.0 * jnp.cos(x), tol=1e-6)
    close(db, jnp.sin(x).sum(), tol=1e-6)
    batched = jax.vmap(f, (0, None, None))(jnp.stack([x, x + 1]), 2.0, masks)
    close(batched[1], full(x + 1, 2.0, masks), tol=1e-6)


def test_on_a_hopper_gpu_long_packed_documents_take_cudnns_packed_layout(monkeypatch):
    """The packed layout's training step took 0.19-0.41x tokamax's with the dense mask
    at 8k-16k tokens (an H200); below 8k it is not measured, so not chosen."""
    from kerneltune.kernels.attention import cudnn_packed, jax_nn, tokamax_backend

    monkeypatch.setattr(jax_nn, "on_gpu", lambda: True)
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: None)
    monkeypatch.setattr(cudnn_packed, "is_hopper", lambda: True)
    kernel = AttentionVariants()
    bf16 = jnp.bfloat16
    docs = _inv(8192, 8192, parts=("segments",), dtype=bf16)
    assert kernel.heuristic_cfg(docs) == VariantConfig(backend="cudnn_packed")
    # Its run-time fallback (ids the layout cannot express) is a library, never itself.
    assert kernel.library_cfg(docs) == VariantConfig(backend="tokamax")
    kept, pruned = kernel.search_space(docs)
    assert kept == [VariantConfig(backend="cudnn_packed")]
    assert {p.cfg.backend for p in pruned} == {"cudnn", "tokamax", "mosaic", "xla", "chunked"}
    assert all("packed layout runs these documents" in p.reason for p in pruned)
    short = _inv(4096, 4096, parts=("segments",), dtype=bf16)
    assert kernel.heuristic_cfg(short) == VariantConfig(backend="tokamax")

    # In training its backward holds float32 buffers per segment slot (2.24 GiB against
    # tokamax's 0.25 at 8k, 16 heads): chosen while they stay within 4 GiB.
    def training(t, n):
        return dataclasses.replace(
            _inv(t, t, parts=("segments",), dtype=bf16, n=n), differentiated=True
        )

    assert kernel.heuristic_cfg(training(16384, 16)).backend == "cudnn_packed"  # 4 GiB
    # 8 GiB: a library, and in training cuDNN (tokamax's backward with a mask races);
    # kerneltune's Mosaic kernel where it runs (a Hopper GPU).
    assert kernel.heuristic_cfg(training(16384, 32)).backend == "cudnn"
    # Where kerneltune's Mosaic kernel runs, it takes every training call with segment
    # ids (plain attention's memory), and the forward alone below 16k tokens: at 8k
    # the packed layout's forward took up to 5x the kernel's (an H200, 2026-11-29).
    monkeypatch.setattr(kernel, "mosaic_runs", lambda inv: True)
    assert kernel.heuristic_cfg(training(16384, 32)).backend == "mosaic"
    assert kernel.heuristic_cfg(training(16384, 16)).backend == "mosaic"
    assert kernel.heuristic_cfg(docs).backend == "mosaic"  # 8k, the forward
    long = _inv(16384, 16384, parts=("segments",), dtype=bf16)
    assert kernel.heuristic_cfg(long).backend == "cudnn_packed"
    monkeypatch.setattr(kernel, "mosaic_runs", lambda inv: False)
    assert kernel.heuristic_cfg(_inv(16384, 16384, parts=("segments",), dtype=bf16, n=32)) == (
        VariantConfig(backend="cudnn_packed")  # the forward alone needs no such buffers
    )
    # What the layout cannot take (a mask beside the ids, a window) keeps the libraries.
    for inv in (
        _inv(8192, 8192, parts=("segments", "mask"), dtype=bf16),
        _inv(8192, 8192, parts=("segments",), window=(512, 0), dtype=bf16),
    ):
        assert kernel.heuristic_cfg(inv).backend != "cudnn_packed"


def test_in_training_with_a_mask_the_heuristic_and_tuning_leave_tokamax_out(monkeypatch):
    """tokamax 0.0.17's backward given a mask returned wrong key gradients in 2-4 of 6
    runs on an H200 (BENCHMARKS.md, 2026-11-27): a training call with a mask or segment
    ids goes to cuDNN, or to XLA where cuDNN does not take it (a soft cap); the forward
    alone and a bias without a mask keep tokamax."""
    from kerneltune.kernels.attention import jax_nn, tokamax_backend

    monkeypatch.setattr(jax_nn, "on_gpu", lambda: True)
    monkeypatch.setattr(tokamax_backend, "unsupported", lambda dtype, head_dim: None)
    kernel = AttentionVariants()
    bf16 = jnp.bfloat16

    def training(**kw):
        return dataclasses.replace(_inv(4096, 4096, dtype=bf16, **kw), differentiated=True)

    for parts in (("segments",), ("mask",)):
        assert kernel.heuristic_cfg(_inv(4096, 4096, parts=parts, dtype=bf16)).backend == (
            "tokamax"
        )
        inv = training(parts=parts)
        assert kernel.heuristic_cfg(inv).backend == "cudnn"
        kept, pruned = kernel.search_space(inv)
        assert kept == [VariantConfig(backend="cudnn")]
        (why,) = [p.reason for p in pruned if p.cfg.backend == "tokamax"]
        assert "race" in why and "wrong key gradients" in why
    capped = training(parts=("segments",), soft_cap=30.0)
    assert kernel.heuristic_cfg(capped).backend == "chunked"
    kept, pruned = kernel.search_space(capped)
    assert kept and {c.backend for c in kept} <= {"chunked", "xla"}
    assert any(p.cfg.backend == "tokamax" and "race" in p.reason for p in pruned)
    assert kernel.heuristic_cfg(training(soft_cap=30.0)).backend == "tokamax"
    assert kernel.heuristic_cfg(training(parts=("lengths",))).backend == "cudnn"


@pytest.mark.parametrize("soft_cap", [None, 20.0])
@pytest.mark.parametrize("parts", ["segments", "mask"])
def test_a_differentiated_tokamax_call_with_a_mask_never_runs_tokamax(monkeypatch, parts, soft_cap):
    """Under `jax.grad` (a remat or a jit inside the gradient hides that from the
    heuristic) the tokamax backend given a mask runs the trusted path, forward and
    backward: its gradients match the reference and tokamax is never imported."""
    from kerneltune.kernels.attention import tokamax_backend

    class NoTokamax:
        @staticmethod
        def import_module(name):
            raise AssertionError(f"imported {name}")

    def no_packed_kernel():
        raise AssertionError("imported tokamax's packed kernel")

    monkeypatch.setattr(tokamax_backend, "importlib", NoTokamax)
    # Cached after a GPU test ran tokamax: replaced, so that a call to it is seen.
    monkeypatch.setattr(tokamax_backend, "_packed_documents", no_packed_kernel)
    q, k, v = _qkv(3)
    masks = (
        Masks(q_segments=Q_DOCS, kv_segments=KV_DOCS)
        if parts == "segments"
        else Masks(mask=jax.random.bernoulli(jax.random.key(4), 0.7, (B, 1, T, S)))
    )
    kw = dict(causal=False, sm_scale=0.3, window=None, soft_cap=soft_cap)

    def ours(q, k, v):
        return tokamax_backend.attention_variant(q, k, v, None, masks, **kw)

    def ref(q, k, v):
        return attention_features_xla(
            q, k, v, None, masks, scale=0.3, is_causal=False, local_window_size=None,
            logits_soft_cap=soft_cap,
        )  # fmt: skip

    w = rand((B, T, N, H), seed=8)
    with jax.default_matmul_precision("highest"):  # float32 products on a GPU too
        got = jax.jit(jax.grad(lambda *a: (ours(*a) * w).sum(), (0, 1, 2)))(q, k, v)
        want = jax.grad(lambda *a: (ref(*a) * w).sum(), (0, 1, 2))(q, k, v)
    for g, e in zip(got, want):
        close(g, e, tol=1e-4)
    with pytest.raises(AssertionError, match="imported tokamax"):
        ours(q, k, v)  # the forward alone is tokamax's


def _dots_and_transposes(fn, *args):
    """The shapes of the dots and transposes in `fn`'s compiled program."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    return sorted(re.findall(r"= (\w+\[[\d,]*\])\{[^}]*\} (dot|transpose)\(", text))


def _grouped_query_call(t=64, n=8, kh=2, h=16):
    q = jax.ShapeDtypeStruct((1, t, n, h), jnp.float32)
    k = jax.ShapeDtypeStruct((1, t, kh, h), jnp.float32)
    return q, k


@pytest.mark.parametrize(
    "kw",
    [dict(bias=(1, 1)), dict(bias=(1, 8)), dict(is_causal=True, local_window_size=(16, 0))],
    ids=["bias-B1TS", "bias-BNTS", "window"],
)
def test_a_one_block_variant_multiplies_as_jax_nn_does(kw):
    # The grouped queries' logits were one einsum over (key head, group), which XLA laid
    # out with the group innermost on a CPU: moving it back took 1.5-1.7x jax.nn's whole
    # attention (T 256, 8 query / 2 key heads). The groups are mapped over now, as
    # jax.nn does: its dots and layout moves, forward and training step (the masks are
    # built otherwise).
    q, k = _grouped_query_call()
    kw = dict(kw)
    bias = jax.ShapeDtypeStruct((*kw.pop("bias"), 64, 64), jnp.float32) if "bias" in kw else None
    ours = lambda q, k, v, b: attention(q, k, v, b, executor=EX, **kw)  # noqa: E731
    plain = lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, b, **kw)  # noqa: E731
    argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
    for make in (lambda f: f, lambda f: jax.grad(lambda *a: f(*a).sum(), argnums)):
        got = _dots_and_transposes(make(ours), q, k, k, bias)
        assert got == _dots_and_transposes(make(plain), q, k, k, bias)


def test_a_one_block_variant_with_a_bias_per_head_compiles_to_jax_nns_program():
    from benchmarks.harness import program_text

    q, k = _grouped_query_call()
    bias = jax.ShapeDtypeStruct((1, 8, 64, 64), jnp.float32)
    ours = lambda q, k, v, b: attention(q, k, v, b, executor=EX)  # noqa: E731
    plain = lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, b)  # noqa: E731
    for make in (lambda f: f, lambda f: jax.grad(lambda *a: f(*a).sum(), (0, 1, 2, 3))):
        assert program_text(make(ours), (q, k, k, bias)) == program_text(
            make(plain), (q, k, k, bias)
        )


def test_a_variant_call_read_back_from_a_manifest_has_its_masks(tmp_path):
    # A manifest keeps the `Masks` named tuple as a plain tuple: `kerneltune tune
    # MANIFEST` failed on every variant call ("'tuple' object has no attribute
    # 'q_segments'"), and plain attention's calls on a CPU are variant calls.
    from kerneltune._src.caching import manifest
    from kerneltune._src.kernel import recording

    q, k, v = _qkv()
    recording.clear_invocations()
    with recording.record_calls():
        jax.jit(lambda q: attention(q, k, v, is_causal=True, local_window_size=4, executor=EX))(q)
    path = tmp_path / "calls.json"
    manifest.save_manifest(path)
    (record,) = recording.iter_records(manifest.load_manifest(path))
    recording.clear_invocations()
    kernel = AttentionVariants()
    inv = record.invocation(kernel)
    assert isinstance(inv.args[4], Masks)
    assert kernel.heuristic_cfg(inv).backend in ("xla", "chunked")
