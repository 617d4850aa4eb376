"""The cuDNN packed-layout backend's CPU side: segment ids turned into cuDNN's document
offsets and lengths, the run-time check of which ids the layout expresses, and the
choice between the packed path and the fallback."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kerneltune.kernels.attention import cudnn_packed as cp
from kerneltune.kernels.attention.variants import VariantConfig
from tests.helpers import rand

# Tests of what happens off a GPU: on one, cuDNN and tokamax run (or name float32).
cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="behaviour off a GPU")


def layout_mask(lengths, offsets, t, causal):
    """`[B, T, T]`: True where cuDNN's packed layout lets query i see key j: both in the
    same segment (`offsets[s] <= i < offsets[s] + lengths[s]`), j <= i when causal."""
    pos = np.arange(t)
    out = np.zeros((lengths.shape[0], t, t), bool)
    for b in range(lengths.shape[0]):
        for start, n in zip(offsets[b], lengths[b]):
            if start < 0:
                continue
            inside = (pos >= start) & (pos < start + n)
            out[b] |= inside[:, None] & inside[None, :]
    if causal:
        out &= pos[None, :, None] >= pos[None, None, :]
    return out


def segment_mask(ids, causal):
    """`[B, T, T]`: True where a query may see a key given segment ids (what the op means)."""
    ids = np.asarray(ids)
    t = ids.shape[1]
    out = ids[:, :, None] == ids[:, None, :]
    if causal:
        out &= np.arange(t)[None, :, None] >= np.arange(t)[None, None, :]
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_documents_describe_the_same_attention_as_the_segment_ids(seed, causal):
    rng = np.random.default_rng(seed)
    b, t = 3, 40
    # Non-decreasing ids: documents of random lengths, a row may be one document.
    ids = np.sort(rng.integers(0, rng.integers(1, 9), size=(b, t)), axis=1).astype(np.int32)
    lengths, offsets, count = cp.documents(jnp.asarray(ids), slots=8)
    lengths, offsets = np.asarray(lengths), np.asarray(offsets)
    assert offsets.shape == (b, 9) and lengths.shape == (b, 8)
    assert np.array_equal(count, [len(np.unique(r)) for r in ids])
    np.testing.assert_array_equal(
        layout_mask(lengths, offsets, t, causal), segment_mask(ids, causal)
    )
    # The slots after the last document hold -1, as cuDNN's layout asks; lengths sum to T.
    for row, n in zip(range(b), count):
        assert (offsets[row, n:] == -1).all() and (lengths[row, n:] == -1).all()
        assert lengths[row, :n].sum() == t


def test_ids_the_layout_cannot_express_are_not_packable():
    # Compiled whole (op by op, each of its primitives compiled alone for every call).
    packable = jax.jit(cp.packable, static_argnames="slots")
    ordered = jnp.asarray([[0, 0, 1, 1, 2, 2]])
    assert bool(packable(ordered, ordered, slots=3))
    assert not bool(packable(ordered, ordered, slots=2))  # 3 documents, 2 slots
    assert not bool(packable(ordered, ordered + 1, slots=3))  # queries' and keys' differ
    interleaved = jnp.asarray([[0, 1, 0, 1, 2, 2]])  # a document in two runs
    assert not bool(packable(interleaved, interleaved, slots=8))
    assert not bool(packable(ordered, ordered[:, :4], slots=8))  # other lengths


def test_packed_or_takes_the_packed_path_only_for_packable_ids_under_jit_and_grad():
    # A stand-in for cuDNN: the "packed" path attends within the layout's segments, the
    # fallback with the segment ids; they agree, and a marker tells which one ran.
    q = rand((2, 12, 2, 8), seed=0)

    def attend(q, allowed):
        logits = jnp.einsum("btnh,bsnh->bnts", q, q)
        logits = jnp.where(allowed[:, None], logits, -1e30)
        return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(logits, axis=-1), q)

    def run(q, ids, marker):
        def packed(lengths, offsets, q):
            pos = jnp.arange(q.shape[1])
            seg = jnp.sum(pos[None, :, None] >= offsets[:, None, :-1], axis=-1)  # slot index + 1
            seg = jnp.where(offsets[:, None, 0] >= 0, seg, 0)
            return attend(q, seg[:, :, None] == seg[:, None, :]) + marker

        def fallback(q):
            return attend(q, ids[:, :, None] == ids[:, None, :])

        return cp.packed_or(packed, fallback, ids, ids, 4, q)

    ordered = jnp.asarray(np.repeat([[0, 1, 2]], 2, axis=0).repeat(4, axis=1), jnp.int32)
    many = jnp.asarray(np.repeat([np.arange(6)], 2, axis=0).repeat(2, axis=1), jnp.int32)
    fallback_only = jax.jit(lambda q, ids: run(q, ids, 0.0))
    packed_marked = jax.jit(lambda q, ids: run(q, ids, 100.0))
    # Packable (3 documents, 4 slots): the packed path ran (marked), equal otherwise.
    got = packed_marked(q, ordered)
    # Around 100 float32's step is 7.6e-6: the marker's removal costs that much.
    np.testing.assert_allclose(got - 100.0, fallback_only(q, ordered), atol=1e-4)
    # 6 documents, 4 slots: the fallback ran (no marker).
    np.testing.assert_allclose(packed_marked(q, many), fallback_only(q, many), atol=1e-5)
    # Gradients go through the branch that ran (the marker is a constant).
    g = jax.jit(jax.grad(lambda q: packed_marked(q, ordered).sum()))(q)
    g_ref = jax.jit(jax.grad(lambda q: fallback_only(q, ordered).sum()))(q)
    np.testing.assert_allclose(g, g_ref, atol=1e-4)


@cpu_only
@pytest.mark.parametrize("backend", ["cudnn_packed", "cudnn", "tokamax"])
def test_a_library_config_where_the_library_cannot_run_falls_back_to_xla(backend):
    # Off a GPU an explicit cuDNN or tokamax config runs the chunked XLA path. It used to
    # reach that path without a block of queries and fail: "'<' not supported between
    # instances of 'int' and 'NoneType'".
    from kerneltune.kernels import attention

    key = jax.random.key(1)
    q, k, v = (jax.random.normal(jax.random.fold_in(key, i), (1, 32, 2, 8)) for i in range(3))
    ids = jnp.asarray(np.repeat([[0, 1, 2, 3]], 8, axis=1), jnp.int32)
    got = attention(
        q, k, v, is_causal=True, query_segment_ids=ids, kv_segment_ids=ids,
        cfg=VariantConfig(backend=backend),
    )  # fmt: skip
    mask = jnp.asarray(segment_mask(ids, causal=True))[:, None]
    want = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_backend_names_why_it_cannot_run_a_call():
    from kerneltune._src.kernel.base import Invocation
    from kerneltune.kernels.attention.masking import Masks

    q = jnp.ones((1, 16, 2, 8), jnp.bfloat16)
    ids = jnp.zeros((1, 16), jnp.int32)
    static = {"causal": True, "sm_scale": 1.0, "window": None, "soft_cap": None}
    no_ids = Invocation("attention_variants", (q, q, q, None, Masks()), static)
    assert "segment ids" in cp._unsupported(no_ids)
    with_ids = Invocation(
        "attention_variants", (q, q, q, None, Masks(q_segments=ids, kv_segments=ids)), static
    )
    reason = cp._unsupported(with_ids)
    if jax.default_backend() == "cpu":
        assert reason is not None and ("Hopper" in reason or "packed layout" in reason)


def test_grouped_query_key_strides_are_known_per_jax_release():
    # JAX 0.10 strides the packed keys by the queries' heads (wrong for grouped-query
    # attention: the backend repeats the keys' heads there); JAX 0.12 by their own.
    release = tuple(int(x) for x in jax.__version__.split(".")[:2])
    if release <= (0, 10):
        assert not cp._strides_grouped_keys()
    if release >= (0, 12):
        assert cp._strides_grouped_keys()
