"""`attention`'s arguments as `jax.nn.dot_product_attention` takes them: the inputs it
accepts, the error types it raises, and the calls only it computes
(`kerneltune/kernels/attention/arguments.py`).

Each case calls both functions with the same arguments, so the expectation is the
installed JAX's behaviour, not a copy of it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kerneltune.kernels import attention
from tests.helpers import close, heuristics_executor, rand

EX = heuristics_executor()
TOL = 1e-5


def ours(*args, **kwargs):
    return attention(*args, executor=EX, **kwargs)


def qkv(t=6, s=5, heads=4, kv_heads=2, d=8, batch=2, dtype=jnp.float32, seed=0):
    return (
        rand((batch, t, heads, d), dtype, seed=seed),
        rand((batch, s, kv_heads, d), dtype, seed=seed + 1),
        rand((batch, s, kv_heads, d), dtype, seed=seed + 2),
    )


def same_result(args, kwargs):
    want = jax.nn.dot_product_attention(*args, **kwargs)
    got = ours(*args, **kwargs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        close(g, w, tol=TOL)


def error_type(fn, *args, **kwargs):
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return info.type


Q, K, V = qkv()


# Before: a TypeError for each of the first three (jax.nn: ValueError), a success for
# lengths of another integer dtype (jax.nn wants int32), a ValueError for a bias that
# does not broadcast (jax.nn: TypeError, from lax.add).
@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((Q, K, V), dict(mask=jnp.ones((6, 5), jnp.int32))),
        ((Q, K, V.astype(jnp.bfloat16)), {}),
        ((Q.astype(jnp.bfloat16), K, V), {}),
        ((Q, K, V), dict(query_seq_lengths=jnp.array([3, 6], jnp.int16))),
        ((Q, K, V), dict(key_value_seq_lengths=jnp.array([3, 5], jnp.uint32))),
        ((Q, K, V), dict(bias=jnp.ones((3, 5)))),
        ((Q, K, V), dict(mask=jnp.ones((6, 7), bool))),
    ],
    ids=["mask_int", "value_dtype", "query_dtype", "lengths_int16", "lengths_uint32",
         "bias_shape", "mask_shape"],
)  # fmt: skip
def test_bad_input_raises_the_error_type_jax_nn_raises(args, kwargs):
    want = error_type(jax.nn.dot_product_attention, *args, **kwargs)
    assert error_type(ours, *args, **kwargs) is want


def test_int64_lengths_under_x64_are_refused_as_jax_nn_refuses_them():
    with jax.enable_x64(True):
        lengths = jnp.array([3, 6])  # int64
        want = error_type(jax.nn.dot_product_attention, Q, K, V, query_seq_lengths=lengths)
        assert error_type(ours, Q, K, V, query_seq_lengths=lengths) is want is ValueError


# Before: each raised (lists: "must be an array"; is_causal: "must be a bool"; a bool
# window: "non-negative int"; mixed ranks: "must all be [batch, seq, heads, head_dim]").
@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((np.asarray(Q).tolist(), np.asarray(K).tolist(), np.asarray(V).tolist()), {}),
        ((Q, K, V), dict(query_seq_lengths=[3, 6], key_value_seq_lengths=[5, 2])),
        ((Q, K, V), dict(is_causal=1)),
        ((Q, K, V), dict(is_causal=None)),
        ((Q, K, V), dict(is_causal=jnp.bool_(True))),
        ((Q[0], K[:1], V[:1]), dict(is_causal=True)),
        ((Q[:1], K[0], V[0]), dict(mask=jnp.ones((5,), bool))),
        ((Q[0, 0], K[0], V[0]), {}),
    ],
    ids=["lists", "length_lists", "causal_1", "causal_none", "causal_array", "q3_k4",
         "q4_k3", "q2"],
)  # fmt: skip
def test_input_jax_nn_takes_is_taken(args, kwargs):
    same_result(args, kwargs)


# Before: `implementation` and `return_residual` were unexpected keywords; integer
# inputs a TypeError; a negative window side a ValueError; a head_dim of 0 a
# ZeroDivisionError.
@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((Q, K, V), dict(implementation="xla", is_causal=True)),
        ((Q, K, V), dict(implementation=None, bias=rand((4, 6, 5), seed=9))),
        ((Q, K, V), dict(return_residual=True, query_seq_lengths=jnp.array([2, 6], jnp.int32))),
        ((Q[0], K[0], V[0]), dict(return_residual=True, is_causal=True)),
        ((Q, K, V), dict(local_window_size=(-1, 2))),
        ((Q, K, V), dict(local_window_size=-1)),
        ((Q, K, V), dict(local_window_size=(3, -1), is_causal=True)),
    ],
    ids=["xla", "none", "residual", "residual_unbatched", "window_neg_left", "window_neg",
         "window_neg_right"],
)  # fmt: skip
def test_what_only_jax_nn_computes_gives_its_result(args, kwargs):
    same_result(args, kwargs)


@pytest.mark.filterwarnings("ignore:divide by zero encountered")  # jax.nn's 1 / sqrt(0)
def test_a_head_dim_of_0_gives_jax_nns_empty_result():
    # Before: ZeroDivisionError from the default scale, 1 / sqrt(head_dim).
    same_result((Q[..., :0], K[..., :0], V[..., :0]), {})


# Before: the forward of an empty sequence (no queries, or no keys) gave jax.nn's result
# but its gradient raised ZeroDivisionError: a length of 0 counted as one the flash
# kernel tiles, and the backward's block heuristic divided by it. (16: the other
# sequence one the kernel tiles, so nothing else sends the call elsewhere.)
@pytest.mark.parametrize(
    "t, s", [(0, 16), (16, 0), (0, 0)], ids=["no_queries", "no_keys", "neither"]
)
@pytest.mark.parametrize("causal", [False, True])
def test_an_empty_sequence_has_jax_nns_result_and_gradients(t, s, causal):
    same_loss_and_gradients(*qkv(t=t, s=s), is_causal=causal)


# Before: under KERNELTUNE_PLATFORM=triton (the Pallas kernels, as on a GPU) a batch of
# 0 ran the flash kernel, whose block slices of one batch row failed ("slice_sizes
# must be less than or equal to operand shape"), forward and gradient.
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_an_empty_batch_has_jax_nns_result_and_gradients_where_pallas_runs(kv_heads):
    from kerneltune._src.core import options

    with options.scoped(platform="triton"):  # the Pallas kernels, in the interpreter
        same_loss_and_gradients(*qkv(t=16, s=16, kv_heads=kv_heads, batch=0), is_causal=True)


def same_loss_and_gradients(q, k, v, **kwargs):
    """`sum(out · dout)` and its gradients by q, k and v are jax.nn's."""
    dout = rand(q.shape, seed=7)

    def grads(fn):
        def loss(q, k, v):
            return (fn(q, k, v, **kwargs) * dout).sum()

        return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)

    (got_loss, got), (want_loss, want) = grads(ours), grads(jax.nn.dot_product_attention)
    close(got_loss, want_loss, tol=TOL)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        close(g, w, tol=TOL)


def test_integer_inputs_and_a_bool_window_give_jax_nns_results():
    # jax.nn promotes integers with float32 (and a bool window's side with positions):
    # not under the suite's strict promotion.
    q, k = jnp.arange(48).reshape(1, 3, 2, 8) % 5, jnp.arange(32).reshape(1, 2, 2, 8) % 3
    with jax.numpy_dtype_promotion("standard"):
        want = jax.nn.dot_product_attention(q, k, k)
        got = ours(q, k, k)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        same_result((Q, K, V), dict(local_window_size=True))  # a window of 1 each side


@pytest.mark.parametrize("implementation", ["cudnn", "no such implementation"])
def test_an_implementation_jax_nn_refuses_is_refused_alike(implementation):
    # On a CPU jax.nn has no cuDNN (a RuntimeError); an unknown name is a ValueError.
    if implementation == "cudnn" and jax.default_backend() != "cpu":
        pytest.skip("cuDNN may run here")
    kwargs = dict(implementation=implementation)
    want = error_type(jax.nn.dot_product_attention, Q, K, V, **kwargs)
    assert error_type(ours, Q, K, V, **kwargs) is want


def test_gradients_of_a_negative_window_and_of_return_residual_match_jax_nn():
    dout = rand(Q.shape, seed=7)

    def grads(fn, **kwargs):
        def loss(q, k, v):
            out = fn(q, k, v, **kwargs)
            out = out[0] + out[1][..., None] if isinstance(out, tuple) else out
            return (out * dout).sum()

        return jax.grad(loss, argnums=(0, 1, 2))(Q, K, V)

    for kwargs in (dict(local_window_size=(2, -1)), dict(return_residual=True)):
        want = grads(jax.nn.dot_product_attention, **kwargs)
        for g, w in zip(grads(ours, **kwargs), want, strict=True):
            close(g, w, tol=TOL)


@pytest.mark.parametrize(
    "kwargs",
    [dict(implementation="xla"), dict(return_residual=True), dict(local_window_size=(-2, 3))],
)
def test_kerneltune_only_arguments_are_refused_where_jax_nn_computes_the_call(kwargs):
    docs = jnp.zeros((2, 6), jnp.int32), jnp.zeros((2, 5), jnp.int32)
    with pytest.raises(ValueError, match=r"runs as jax\.nn\.dot_product_attention, which takes no"):
        ours(Q, K, V, logits_soft_cap=5.0, **kwargs)
    with pytest.raises(ValueError, match="takes no query_segment_ids or kv_segment_ids"):
        ours(Q, K, V, query_segment_ids=docs[0], kv_segment_ids=docs[1], **kwargs)
