"""kerneltune's Mosaic GPU flash attention (`mosaic_flash*.py`) in JAX's Mosaic GPU
interpreter on the CPU: values and gradients of every variant it takes against the
whole-logits reference, the block ranges that decide its work, and its refusals.

The interpreter runs the kernels' TMA copies, barriers, loops and masking as written;
its wgmma takes no transposed operand, so there the products run in XLA
(`mosaic_flash_ops.Registers.matmul`). The GPU suite runs the same checks on the
tensor cores (`test_gpu_attention_variants.py`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from kerneltune._src.core import jax_compat
from kerneltune._src.kernel.base import Invocation
from kerneltune.kernels.attention.features import attention_features_xla
from kerneltune.kernels.attention.masking import Masks, document_ranges
from kerneltune.kernels.attention.mosaic_flash import flash_forward
from kerneltune.kernels.attention.mosaic_flash_backward import flash_backward
from kerneltune.kernels.attention.mosaic_flash_layout import (
    BLOCK,
    FlashShape,
    Visits,
    block_ranges,
    in_work_order,
)
from kerneltune.kernels.attention.variants import AttentionVariants, VariantConfig
from tests.helpers import close, heuristics_executor, rand

EX = heuristics_executor()
B, T, S, N, K, H = 2, 100, 150, 4, 2, 64

needs_interpreter = pytest.mark.skipif(
    jax_compat.mosaic_gpu_interpret_params() is None or jax.default_backend() != "cpu",
    reason="JAX's Mosaic GPU interpreter on a CPU",
)

#: With `docs`: three documents in the first batch row, two in the second; the
#: queries' ids are the keys' cut to the queries' length.
VARIANTS = {
    # Four query heads on two key heads (which key head a query head reads) in two
    # variants; the others take two on one: the interpreter's time grows with the grid.
    "causal_softcap": dict(causal=True, soft_cap=5.0),
    "window_padded": dict(causal=True, window=(40, 0), lengths=(70, 120), heads=(2, 1)),
    "docs": dict(causal=True, docs=True),
    "docs_window_softcap_padded": dict(
        causal=False, window=(30, 10), soft_cap=8.0, docs=True, lengths=(90, 140), heads=(2, 1)
    ),
    # A query document with no key: the row weighs every key alike (as jax.nn does).
    "docs_without_keys": dict(causal=False, docs=True, orphan=True, heads=(2, 1)),
    # 256 tokens in 3 and 2 documents: blocks below the diagonal are whole, run unmasked.
    "whole_blocks": dict(causal=True, docs=True, t=256, s=256, heads=(2, 1)),
    # Two warpgroups of 64 queries a block, sharing its keys: the first fetches, both
    # release each slot before it is refilled. In the first batch row the second block
    # of 128 queries visits the most key blocks, so it is taken first (`in_work_order`).
    "two_warpgroups": dict(
        causal=True,
        docs=True,
        soft_cap=5.0,
        lengths=(250, 256),
        block_q=128,
        t=256,
        s=256,
        heads=(2, 1),
    ),
}


def _masks(spec) -> Masks:
    lengths = spec.get("lengths")
    t, s = spec.get("t", T), spec.get("s", S)
    q_ids = k_ids = None
    if spec.get("docs"):
        k_ids = jnp.asarray(np.stack([np.arange(s) * 3 // s, np.arange(s) * 2 // s]), jnp.int32)
        q_ids = k_ids[:, :t]
        if spec.get("orphan"):
            q_ids = jnp.where(q_ids == 1, 9, q_ids)
    return Masks(
        q_lengths=None if lengths is None else jnp.full((B,), lengths[0], jnp.int32),
        kv_lengths=None if lengths is None else jnp.full((B,), lengths[1], jnp.int32),
        q_segments=q_ids,
        kv_segments=k_ids,
    )


def _output_and_gradients(fn, w, q, k, v, *, jit=True):
    """`fn`'s output and the gradients of `sum(fn(q, k, v) * w)`, from one program (in
    the interpreter each program of the kernels takes seconds to build)."""

    def loss(*a):
        out = fn(*a)
        return (out * w).sum(), out

    grad = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)
    (_, out), grads = (jax.jit(grad) if jit else grad)(q, k, v)
    return out, grads


#: The variants that take longest in the interpreter on a 2-core CPU (12-22 s each):
#: `make test-slow` runs them. Window and padding stay in `make test` through the
#: variant that combines every feature.
SLOW_VARIANTS = ("two_warpgroups", "whole_blocks", "window_padded")


@needs_interpreter
@pytest.mark.parametrize(
    "variant",
    [pytest.param(v, marks=pytest.mark.slow) if v in SLOW_VARIANTS else v for v in VARIANTS],
)
def test_every_variant_matches_the_reference_values_and_gradients(variant):
    spec = VARIANTS[variant]
    masks = _masks(spec)
    static = dict(
        causal=spec["causal"], sm_scale=H**-0.5, window=spec.get("window"),
        soft_cap=spec.get("soft_cap"),
    )  # fmt: skip
    kernel = AttentionVariants(executor=EX, interpret=True)
    t, s = spec.get("t", T), spec.get("s", S)
    n, kv = spec.get("heads", (N, K))
    q = rand((B, t, n, H), seed=1).astype(jnp.bfloat16)
    k = rand((B, s, kv, H), seed=2).astype(jnp.bfloat16)
    v = rand((B, s, kv, H), seed=3).astype(jnp.bfloat16)
    w = rand((B, t, n, H), seed=4)

    def ours(q, k, v):
        cfg = VariantConfig(backend="mosaic", block_q=spec.get("block_q", 64))
        return EX(kernel, q, k, v, None, masks, cfg=cfg, **static).astype(jnp.float32)

    def ref(q, k, v):
        f32 = [x.astype(jnp.float32) for x in (q, k, v)]
        return attention_features_xla(
            *f32, None, masks, scale=static["sm_scale"], is_causal=static["causal"],
            local_window_size=static["window"], logits_soft_cap=static["soft_cap"],
        )  # fmt: skip

    out, grads = _output_and_gradients(ours, w, q, k, v)
    # The reference compiled whole: op by op, each of its ~80 primitives compiled alone.
    want, want_grads = _output_and_gradients(ref, w, q, k, v)
    close(out, want, tol=2e-2)
    for got, expected in zip(grads, want_grads, strict=True):
        close(got.astype(jnp.float32), expected, tol=3e-2)
    if variant == "docs":  # the forward alone: the program an inference call runs
        close(jax.jit(ours)(q, k, v), want, tol=2e-2)


@needs_interpreter
def test_vmap_over_a_batch_of_calls_matches_each_call():
    kernel = AttentionVariants(executor=EX, interpret=True)
    q = rand((3, 1, 64, 2, H), seed=5).astype(jnp.bfloat16)
    k = rand((3, 1, 64, 1, H), seed=6).astype(jnp.bfloat16)

    def one(q, k):
        return EX(kernel, q, k, k, None, Masks(), causal=True, sm_scale=0.125, window=None,
                  soft_cap=30.0, cfg=VariantConfig(backend="mosaic"))  # fmt: skip

    batched = jax.vmap(one)(q, k)
    for i in range(3):
        np.testing.assert_array_equal(batched[i], one(q[i], k[i]))


#: `block_ranges`, `in_work_order` and `document_ranges` compiled whole, as the kernels'
#: programs run them: called op by op, each of their primitives compiled alone for every
#: new shape (about 60 programs a test).
jit_block_ranges = jax.jit(block_ranges, static_argnums=(0, 3, 4))
jit_in_work_order = jax.jit(in_work_order)
jit_document_ranges = jax.jit(document_ranges)


def _shape(**kw) -> FlashShape:
    base = dict(block_q=64, block_kv=64, head_dim=64, groups=1, causal=True, window=None,
                soft_cap=None, scale=1.0, segmented=False)  # fmt: skip
    return FlashShape(**{**base, **kw})


def test_packed_documents_visit_only_their_own_key_blocks():
    # 4 documents of 128 tokens, causal: a query block sees its own document's blocks
    # up to its own, never another document's; of those, the blocks before its own are
    # whole (no logit masked), its own is on the diagonal.
    t = 512
    ids = jnp.asarray(np.arange(t)[None] // 128, jnp.int32)
    lens = jnp.asarray([[t, t]], jnp.int32)
    docs = Masks(q_segments=ids, kv_segments=ids)
    kv, q = jit_block_ranges(_shape(segmented=True), lens, docs, t, t)
    first = [2 * (i // 2) for i in range(8)]
    np.testing.assert_array_equal(kv[0, :, :2], [[f, i + 1] for i, f in enumerate(first)])
    # (A query block with no whole block has the empty run at its end, [hi, hi).)
    whole = [[f, i] if i > f else [i + 1, i + 1] for i, f in enumerate(first)]
    np.testing.assert_array_equal(kv[0, :, 2:], whole)
    # For each key block: the query blocks of its document from its own on; whole
    # after its own.
    last = [2 * (j // 2) + 2 for j in range(8)]
    np.testing.assert_array_equal(q[0, :, :2], [[j, e] for j, e in enumerate(last)])
    np.testing.assert_array_equal(q[0, :, 2:], [[min(j + 1, e), e] for j, e in enumerate(last)])
    # Without the documents, causal alone: every block up to its own.
    plain, _ = jit_block_ranges(_shape(), lens, Masks(), t, t)
    runs = [[0, i] if i else [1, 1] for i in range(8)]
    np.testing.assert_array_equal(plain[0], [[0, i + 1, *r] for i, r in enumerate(runs)])


def test_a_block_of_several_documents_is_never_whole_whatever_the_ids():
    # Query block 0 holds documents 0, -1 and 5; key block 0 is all -1. A sentinel id
    # for "several documents" (-1 once) made the pair whole: it ran unmasked, and the
    # queries of document 0 attended to document -1's keys.
    t = 128
    q_ids = jnp.asarray([[0] * 32 + [-1] * 32 + [5] * 64], jnp.int32)
    k_ids = jnp.asarray([[-1] * 64 + [5] * 64], jnp.int32)
    lens = jnp.asarray([[t, t]], jnp.int32)
    docs = Masks(q_segments=q_ids, kv_segments=k_ids)
    kv, _ = jit_block_ranges(_shape(causal=False, segmented=True), lens, docs, t, t)
    assert tuple(np.asarray(kv[0, 0, 2:])) == (1, 1)  # no whole block: all masked
    assert tuple(np.asarray(kv[0, 1, 2:])) == (1, 2)  # 5 against 5: whole


def test_a_window_and_lengths_bound_the_key_blocks():
    t = 512
    lens = jnp.asarray([[300, 200]], jnp.int32)
    got = np.asarray(jit_block_ranges(_shape(window=(100, 0)), lens, Masks(), t, t)[0][0])
    # Block i (queries 64i..64i+63) sees keys from 64i - 100 up to its last query, and
    # none at or past 200; blocks of padded queries only (from 320) see nothing.
    for i in range(5):
        lo = max(0, 64 * i - 100) // 64
        hi = max(-(-min(64 * i + 64, 200) // 64), lo)
        assert tuple(got[i, :2]) == (lo, hi), i
        # Whole: keys from the block's last query − 100 to its first, below 200.
        whole = [
            j
            for j in range(lo, hi)
            if 64 * j >= 64 * i + 63 - 100 and 64 * j + 63 <= 64 * i and 64 * j + 63 < 200
        ]
        assert tuple(got[i, 2:]) == ((whole[0], whole[-1] + 1) if whole else (hi, hi)), i
    assert (got[5:, 1] <= got[5:, 0]).all()


@settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(
    seed=st.integers(0, 2**16),
    ordered=st.booleans(),
    q_len=st.integers(0, 256),
)
def test_the_block_ranges_documents_are_the_per_query_ranges_taken_over_each_block(
    seed, ordered, q_len
):
    """`block_ranges` bounds each block by its lowest and highest valid id, where it
    took a binary search per query before: the keys it allows are the same."""
    rng = np.random.default_rng(seed)
    t = s = 256
    ids = rng.integers(-2, 6, size=(1, s))
    ids = np.sort(ids, axis=1) if ordered else ids
    q_ids = np.sort(rng.integers(-2, 6, size=(1, t)), axis=1) if ordered else ids
    masks = Masks(q_segments=jnp.asarray(q_ids, jnp.int32), kv_segments=jnp.asarray(ids, jnp.int32))
    lens = jnp.asarray([[q_len, s]], jnp.int32)
    shape = _shape(causal=False, segmented=True)
    got = np.asarray(jit_block_ranges(shape, lens, masks, t, s)[0][0, :, :2])
    start, end = (np.asarray(x)[0, 0] for x in jit_document_ranges(masks))
    for i in range(t // 64):
        rows = [r for r in range(64 * i, 64 * i + 64) if r < q_len]
        if not rows:
            assert got[i, 1] <= got[i, 0], i  # nothing to visit
            continue
        lo = min(start[r] for r in rows) // 64
        hi = max(max(-(-max(end[r] for r in rows) // 64), lo), lo)
        assert tuple(got[i]) == (lo, hi), i


@settings(max_examples=20, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(seed=st.integers(0, 2**16), ordered=st.booleans())
def test_document_ranges_are_each_querys_documents_keys(seed, ordered):
    """Per query, the keys `[start, end)` of its document where the kv ids never
    decrease (a binary search, now by sorting), else every key."""
    rng = np.random.default_rng(seed)
    kv = rng.integers(-3, 5, size=(2, 40))
    kv = np.sort(kv, axis=1) if ordered else kv
    q = rng.integers(-4, 6, size=(2, 30))
    masks = Masks(q_segments=jnp.asarray(q, jnp.int32), kv_segments=jnp.asarray(kv, jnp.int32))
    start, end = (np.asarray(x)[:, 0] for x in jit_document_ranges(masks))
    for row in range(2):
        if ordered:
            want = (
                np.searchsorted(kv[row], q[row], "left"),
                np.searchsorted(kv[row], q[row], "right"),
            )
        else:
            want = (np.zeros(30), np.full(30, 40))
        np.testing.assert_array_equal(start[row], want[0])
        np.testing.assert_array_equal(end[row], want[1])


def test_the_block_ranges_run_no_loop():
    """On a GPU every step of a loop waits on the device: `jnp.searchsorted`'s binary
    searches made the ranges cost ten times the forward kernel at 8k tokens with 16
    documents (an H200)."""
    t = 512
    ids = jnp.asarray(np.arange(t)[None] * 4 // t, jnp.int32)
    masks = Masks(q_segments=ids, kv_segments=ids)
    lens = jnp.asarray([[t, t]], jnp.int32)
    text = str(jax.make_jaxpr(lambda m: block_ranges(_shape(segmented=True), lens, m, t, t))(masks))
    assert "while" not in text and "scan" not in text
    assert "while" not in str(jax.make_jaxpr(document_ranges)(masks))


def test_the_kernels_take_the_blocks_with_the_most_visits_first():
    """The GPU starts a grid's blocks in order: causally, in position order the
    longest blocks started last and made the kernel's tail."""
    t = 512
    lens = jnp.asarray([[t, t], [t, t]], jnp.int32)
    ids = jnp.asarray(np.stack([np.arange(t) // 256, np.arange(t) // 128]), jnp.int32)
    kv, q = jit_block_ranges(
        _shape(segmented=True), lens, Masks(q_segments=ids, kv_segments=ids), t, t
    )
    for ranges in (kv, q):
        got = np.asarray(jit_in_work_order(ranges))
        assert got.shape == (2, 8, 5)
        for b in range(2):
            blocks = got[b, :, BLOCK]
            assert sorted(blocks) == list(range(8))  # each block once
            np.testing.assert_array_equal(got[b, :, :4], np.asarray(ranges)[b, blocks])
            counts = got[b, :, 1] - got[b, :, 0]
            assert (np.diff(counts) <= 0).all()  # most visits first
            for c in set(counts):  # ties in position order
                assert list(blocks[counts == c]) == sorted(blocks[counts == c])
    # Two documents of 4 blocks: each document's last block first, its first last.
    assert list(np.asarray(jit_in_work_order(kv))[0, :, BLOCK]) == [3, 7, 2, 6, 1, 5, 0, 4]
    # Key blocks, causally: already longest first.
    assert list(np.asarray(jit_in_work_order(q))[0, :, BLOCK]) == [0, 4, 1, 5, 2, 6, 3, 7]


@pytest.mark.slow
@needs_interpreter
def test_the_launch_order_over_every_heads_blocks_computes_the_same():
    """`heads_outermost=True` launches each head's blocks in turn where the default
    launches each row of blocks for every head: the kernels' outputs are the same."""
    t, n, kv = 192, 2, 1
    ids = jnp.asarray(np.arange(t)[None] * 2 // t, jnp.int32)
    masks = Masks(q_segments=ids, kv_segments=ids)
    lens = jnp.asarray([[t, t]], jnp.int32)
    shape = _shape(groups=n // kv, segmented=True)
    kv_ranges, q_ranges = (in_work_order(r) for r in block_ranges(shape, lens, masks, t, t))
    q = rand((1, t, n, H), seed=21).astype(jnp.bfloat16)
    k = rand((1, t, kv, H), seed=22).astype(jnp.bfloat16)
    v = rand((1, t, kv, H), seed=23).astype(jnp.bfloat16)
    do = rand((1, t, n, H), seed=24).astype(jnp.bfloat16)
    interpret = jax_compat.mosaic_gpu_interpret_params()
    outs = []
    for order in (shape, dataclasses.replace(shape, heads_outermost=True)):
        alike = jnp.mean(v, axis=1, dtype=jnp.float32)
        out, lse = flash_forward(
            order, q, k, v, kv_ranges, lens, ids, ids, alike, interpret=interpret
        )
        delta = jnp.einsum("btnd,btnd->bnt", do.astype(jnp.float32), out.astype(jnp.float32))
        grads = flash_backward(
            order, q, k, v, do, lse, delta, kv_ranges, q_ranges, lens, ids, ids,
            interpret=interpret,
        )  # fmt: skip
        outs.append([out, lse, *grads])
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert float(jnp.abs(outs[0][2].astype(jnp.float32)).max()) > 0  # dq is not all zero


@pytest.mark.parametrize(
    ("ranges", "order", "masked"),
    [
        # (lo, hi, full_lo, full_hi), as `block_ranges` gives them
        ((2, 9, 4, 7), [2, 3, 7, 8, 4, 5, 6], 4),  # masked on both sides of the run
        ((0, 5, 0, 3), [3, 4, 0, 1, 2], 2),  # masked after the run only
        ((1, 5, 5, 5), [1, 2, 3, 4], 4),  # no whole block
        ((3, 6, 3, 6), [3, 4, 5], 0),  # every block whole
        ((4, 4, 4, 4), [], 0),  # nothing to visit
    ],
)
def test_the_kernels_visit_every_block_once_masked_ones_first(ranges, order, masked):
    ranges_ref = jnp.asarray([[ranges]], jnp.int32)
    visits = Visits.read(ranges_ref, 0, 0)
    assert int(visits.count) == len(order) and int(visits.masked) == masked
    assert [int(visits.block(jnp.int32(n))) for n in range(len(order))] == order

    def step(n, seen, masked):  # record each step's block and whether it was masked
        return seen.at[n].set(visits.block(n) * 2 + int(masked))

    seen = visits.run(step, jnp.full((8,), -1, jnp.int32))
    want = [j * 2 + (n < masked) for n, j in enumerate(order)]
    assert list(np.asarray(seen)) == want + [-1] * (8 - len(order))


def _invocation(q, bias=None, masks=None, sm_scale=1.0):
    masks = Masks() if masks is None else masks
    static = {"causal": True, "sm_scale": sm_scale, "window": None, "soft_cap": None}
    return Invocation("attention_variants", (q, q, q, bias, masks), static)


def test_the_backend_names_what_it_does_not_take():
    kernel = AttentionVariants(executor=EX, interpret=True)
    backend = kernel.backend_named("mosaic")
    q = jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.bfloat16)
    assert "bias" in backend.unusable(kernel, _invocation(q, bias=q), None)
    mask = Masks(mask=jnp.ones((1, 1, 64, 64), bool))
    assert "dense mask" in backend.unusable(kernel, _invocation(q, masks=mask), None)
    wide = jax.ShapeDtypeStruct((1, 64, 2, 96), jnp.bfloat16)
    assert "96" in backend.unusable(kernel, _invocation(wide), None)
    f32 = jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.float32)
    assert "float32" in backend.unusable(kernel, _invocation(f32), None)


@needs_interpreter
def test_a_window_wider_than_int32_is_the_whole_sequence():
    kernel = AttentionVariants(executor=EX, interpret=True)
    q = rand((1, 64, 2, H), seed=7).astype(jnp.bfloat16)
    k = rand((1, 64, 1, H), seed=8).astype(jnp.bfloat16)

    def run(window, cfg):
        return EX(kernel, q, k, k, None, Masks(), causal=False, sm_scale=0.125,
                  window=window, soft_cap=None, cfg=cfg)  # fmt: skip

    got = run((2**31 - 1, 2**33), VariantConfig(backend="mosaic"))
    np.testing.assert_array_equal(got, run(None, VariantConfig(backend="mosaic")))


def test_an_empty_sequence_is_refused_with_the_reason():
    kernel = AttentionVariants(executor=EX, interpret=True)
    empty = jax.ShapeDtypeStruct((1, 0, 2, 64), jnp.bfloat16)
    reason = kernel.backend_named("mosaic").unusable(kernel, _invocation(empty), None)
    assert "empty sequence" in reason


@needs_interpreter
def test_a_batch_of_no_rows_is_refused_with_the_reason():
    # Before: only empty sequences were refused; a batch of 0 ran the kernels on a grid
    # of no rows, and the interpreter, padding their buffers to a block, divided by
    # the batch: a ZeroDivisionError. Refused, the heuristic (which asks `unusable`)
    # never picks the kernel for such a call, and a config naming it says why.
    kernel = AttentionVariants(executor=EX, interpret=True)
    q = jnp.zeros((0, 64, 2, H), jnp.bfloat16)
    k = jnp.zeros((0, 64, 1, H), jnp.bfloat16)
    assert "empty" in kernel.backend_named("mosaic").unusable(kernel, _invocation(q), None)
    ids = jnp.zeros((0, 64), jnp.int32)
    masks = Masks(q_segments=ids, kv_segments=ids)
    with pytest.raises(ValueError, match="takes no empty sequence or batch"):
        EX(kernel, q, k, k, None, masks, causal=True, sm_scale=0.125, window=None,
           soft_cap=None, cfg=VariantConfig(backend="mosaic"))  # fmt: skip


def test_its_config_checks_its_blocks():
    assert VariantConfig(backend="mosaic") == VariantConfig(
        backend="mosaic", block_q=64, block_kv=64
    )
    with pytest.raises(ValueError, match="block_kv must be 64 or 128, got 96"):
        VariantConfig(backend="mosaic", block_kv=96)
    for wrong in (32, 256):
        with pytest.raises(ValueError, match=f"64 or 128 with backend='mosaic'.*got {wrong}"):
            VariantConfig(backend="mosaic", block_q=wrong)
    with pytest.raises(ValueError, match="block_kv is a field of backend='mosaic'"):
        VariantConfig(backend="chunked", block_kv=64)


@st.composite
def _calls(draw):
    """A drawn call: lengths, heads, the variant's parts, documents in or out of order."""
    t, s = draw(st.integers(1, 160)), draw(st.integers(1, 160))
    kheads, groups = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    causal = draw(st.booleans())
    window = draw(st.none() | st.tuples(st.integers(0, 90), st.integers(0, 40)))
    cap = draw(st.none() | st.floats(2.0, 30.0))
    docs = draw(st.none() | st.tuples(st.integers(1, 4), st.booleans()))
    lengths = draw(st.none() | st.tuples(st.integers(0, t), st.integers(0, s)))
    return t, s, kheads, groups, causal, window, cap, docs, lengths


@pytest.mark.slow
@needs_interpreter
@settings(max_examples=3, deadline=None, derandomize=True, phases=(Phase.generate,))
@given(_calls())
def test_drawn_calls_match_the_reference_values_and_gradients(call):
    t, s, kheads, groups, causal, window, cap, docs, lengths = call
    b, n = 1, kheads * groups
    q_ids = k_ids = None
    if docs is not None:
        count, ordered = docs
        k_ids = np.arange(s) * count // s
        q_ids = np.arange(t) * count // t
        if not ordered:  # documents interleaved: no key range, the ids alone
            k_ids, q_ids = np.arange(s) % count, np.arange(t) % count
        q_ids, k_ids = (jnp.asarray(x[None], jnp.int32) for x in (q_ids, k_ids))
    masks = Masks(
        q_lengths=None if lengths is None else jnp.asarray([lengths[0]], jnp.int32),
        kv_lengths=None if lengths is None else jnp.asarray([lengths[1]], jnp.int32),
        q_segments=q_ids,
        kv_segments=k_ids,
    )
    static = dict(causal=causal, sm_scale=H**-0.5, window=window, soft_cap=cap)
    kernel = AttentionVariants(executor=EX, interpret=True)
    q = rand((b, t, n, H), seed=11).astype(jnp.bfloat16)
    k = rand((b, s, kheads, H), seed=12).astype(jnp.bfloat16)
    v = rand((b, s, kheads, H), seed=13).astype(jnp.bfloat16)
    w = rand((b, t, n, H), seed=14)

    def ours(q, k, v):
        cfg = VariantConfig(backend="mosaic")
        return EX(kernel, q, k, v, None, masks, cfg=cfg, **static).astype(jnp.float32)

    def ref(q, k, v):
        f32 = [x.astype(jnp.float32) for x in (q, k, v)]
        return attention_features_xla(
            *f32, None, masks, scale=H**-0.5, is_causal=causal, local_window_size=window,
            logits_soft_cap=cap,
        )  # fmt: skip

    out, grads = _output_and_gradients(ours, w, q, k, v)
    want, want_grads = _output_and_gradients(ref, w, q, k, v, jit=False)
    close(out, want, tol=2e-2)
    for got, expected in zip(grads, want_grads, strict=True):
        close(got.astype(jnp.float32), expected, tol=3e-2)


@needs_interpreter
def test_a_program_calling_attention_twice_at_one_shape_traces_each_kernel_once(monkeypatch):
    """Two layers' attention at the same shapes (a model that is not scanned): each
    kernel is traced once for the program, so JAX lowers it once."""
    from kerneltune.kernels.attention import mosaic_flash_api

    traced = []

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            traced.append(name)
            return fn(*args, **kwargs)

        return wrapper

    from kerneltune.kernels.attention import mosaic_flash, mosaic_flash_backward

    # The API imports the kernels where it builds them, so it reads these names then.
    monkeypatch.setattr(mosaic_flash, "flash_forward", counting("fwd", flash_forward))
    monkeypatch.setattr(mosaic_flash_backward, "flash_backward", counting("bwd", flash_backward))
    mosaic_flash_api._differentiable.cache_clear()
    kernel = AttentionVariants(executor=EX, interpret=True)
    masks = _masks(VARIANTS["docs"])
    cfg = VariantConfig(backend="mosaic")
    static = dict(causal=True, sm_scale=H**-0.5, window=None, soft_cap=None)

    def two_layers(q, k, v):
        first = EX(kernel, q, k, v, None, masks, cfg=cfg, **static)
        second = EX(kernel, first, k, v, None, masks, cfg=cfg, **static)
        return second.astype(jnp.float32).sum()

    q = jax.ShapeDtypeStruct((B, T, N, H), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((B, S, K, H), jnp.bfloat16)
    jax.jit(jax.grad(two_layers, (0, 1, 2))).trace(q, k, k)
    mosaic_flash_api._differentiable.cache_clear()
    assert sorted(traced) == ["bwd", "fwd"]
