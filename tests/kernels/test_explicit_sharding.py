"""The bundled ops under sharding in types: arrays placed over the explicit axes of a
mesh (`jax.sharding.AxisType.Explicit`, `jax.set_mesh`) give what plain JAX gives under
`jax.jit`, forward and gradient: the same values, dtypes and output shardings, and no
error where plain JAX runs."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from kerneltune.kernels import (
    GatedLinearUnit,
    GLUConfig,
    attention,
    gated_linear_unit,
    layer_norm,
    linear_softmax_cross_entropy,
    matmul,
    ragged_dot,
    rms_norm,
    softmax,
)
from kerneltune.kernels._args import explicitly_sharded
from tests.helpers import heuristics_executor, host_rng, normal

_EXPLICIT = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
_SET_MESH = getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh", None)

pytestmark = pytest.mark.skipif(
    _EXPLICIT is None or _SET_MESH is None or jax.device_count() < 4,
    reason="needs explicit mesh axes (jax.sharding.AxisType.Explicit, jax.set_mesh) and 4 devices",
)


def explicit_mesh():
    return jax.make_mesh((2, 2), ("data", "model"), axis_types=(_EXPLICIT, _EXPLICIT))


def assert_like_plain_jax(ours, theirs, args, specs, argnums, *, tol=1e-4):
    """`ours(*args)` and the gradient of the sum of its squares with respect to
    `argnums`, under `jax.jit` with `args` placed by `specs` over an explicit mesh, are
    `theirs`': values within `tol`, dtypes and shardings equal."""

    def program(f):
        def both(*a):
            out = f(*a)
            grads = jax.grad(lambda *b: jnp.sum(f(*b).astype(jnp.float32) ** 2), argnums)(*a)
            return out, grads

        return jax.jit(both)

    with _SET_MESH(explicit_mesh()):
        placed = [jax.device_put(a, s) for a, s in zip(args, specs, strict=True)]
        got, want = program(ours)(*placed), program(theirs)(*placed)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        scale = max(1.0, float(np.abs(np.asarray(b, np.float32)).max(initial=0)))
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol * scale
        )
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)


def test_explicitly_sharded_names_only_types_sharded_over_explicit_axes():
    mesh = explicit_mesh()
    auto = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jnp.ones((4, 8))
    assert not explicitly_sharded(x, None)
    assert not explicitly_sharded(jax.device_put(x, jax.NamedSharding(auto, P("x"))))
    with _SET_MESH(mesh):
        assert not explicitly_sharded(jax.device_put(x, P()))  # replicated
        assert explicitly_sharded(x, jax.device_put(x, P(None, "model")))
        assert explicitly_sharded(jax.device_put(x, P(("data", "model"))))


# --- linear_softmax_cross_entropy -------------------------------------------------------


def plain_loss(x, labels, w, where=None, *, reduction="mean"):
    """The loss head as plain JAX writes it: `x @ w` read as float32, the label's logit
    picked by a one-hot (a gather over a sharded vocabulary has no sharding JAX infers)."""
    logits = (x @ w).astype(jnp.float32)
    picked = jnp.sum(logits * jax.nn.one_hot(labels, w.shape[1], dtype=jnp.float32), axis=-1)
    losses = jax.nn.logsumexp(logits, axis=-1) - picked
    if where is not None:
        losses = jnp.where(where, losses, 0.0)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return jnp.sum(losses)
    count = losses.shape[0] if where is None else jnp.sum(where, dtype=jnp.float32)
    return jnp.sum(losses) / count


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "x_spec, w_spec",
    [(P("data"), P()), (P(), P(None, "model")), (P("data"), P(None, "model"))],
    ids=["tokens", "vocab", "tokens+vocab"],
)
def test_loss_head_sharded_by_tokens_or_vocabulary_is_plain_jaxs(key, reduction, x_spec, w_spec):
    # Before: tokens sharded, the chunked backward's product over a chunk's rows raised
    # ShardingTypeError ("Contracting dimensions are sharded"); the vocabulary sharded,
    # the label's logit (a gather) raised, forward and backward. Plain JAX runs both.
    rng = host_rng(key)
    x, w = normal(rng, (32, 16)), normal(rng, (16, 64), scale=0.25)
    labels = jnp.asarray(rng.integers(0, 64, 32), jnp.int32)
    ours = functools.partial(
        linear_softmax_cross_entropy, reduction=reduction, executor=heuristics_executor()
    )
    theirs = functools.partial(plain_loss, reduction=reduction)
    label_spec = P(*x_spec[:1])
    assert_like_plain_jax(ours, theirs, (x, labels, w), (x_spec, label_spec, w_spec), (0, 2))


def test_loss_head_with_a_mask_and_bfloat16_tokens_sharded(key):
    rng = host_rng(key)
    x, w = normal(rng, (32, 16), jnp.bfloat16), normal(rng, (16, 64), jnp.bfloat16, scale=0.25)
    labels = jnp.asarray(rng.integers(0, 64, 32), jnp.int32)
    where = jnp.asarray(rng.random(32) > 0.3)
    ex = heuristics_executor()

    def ours(x, labels, w, where):
        return linear_softmax_cross_entropy(x, labels, w, where=where, executor=ex)

    specs = (P("data"), P("data"), P(), P("data"))
    assert_like_plain_jax(ours, plain_loss, (x, labels, w, where), specs, (0, 2), tol=2e-2)


# --- attention ----------------------------------------------------------------------


def capped_attention(q, k, v, *, cap, local_window_size):
    """Causal attention with a logits soft cap and a window to the left, as plain JAX
    writes it (grouped-query heads by a reshape, not `jnp.repeat`)."""
    b, t, n, h = q.shape
    groups = n // k.shape[2]
    qg = q.reshape(b, t, k.shape[2], groups, h)
    logits = jnp.einsum("btngh,bsnh->bngts", qg, k) / np.sqrt(h)
    logits = cap * jnp.tanh(logits / cap)
    rows, cols = np.arange(t)[:, None], np.arange(k.shape[1])[None, :]
    visible = (cols <= rows) & (cols >= rows - local_window_size)
    probs = jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)
    return jnp.einsum("bngts,bsnh->btngh", probs, v).reshape(q.shape)


@pytest.mark.parametrize(
    "q_spec, kv_spec",
    [(P(None, "data"), P()), (P("data", "model"), P("data")), (P("data", None, "model"),) * 2],
    ids=["tokens", "batch+tokens", "batch+heads"],
)
def test_grouped_query_attention_sharded_by_tokens_is_plain_jaxs(key, q_spec, kv_spec):
    # Before: queries sharded by tokens, the blocked backward's dk and dv (a product
    # summed over the queries) raised ShardingTypeError; jax.nn runs it.
    rng = host_rng(key)
    q = normal(rng, (2, 16, 4, 8))
    k, v = normal(rng, (2, 16, 2, 8)), normal(rng, (2, 16, 2, 8))
    ours = functools.partial(attention, is_causal=True, executor=heuristics_executor())
    theirs = functools.partial(jax.nn.dot_product_attention, is_causal=True)
    assert_like_plain_jax(ours, theirs, (q, k, v), (q_spec, kv_spec, kv_spec), (0, 1, 2))


def test_long_attention_variants_sharded_by_tokens_are_plain_jaxs(key):
    # Before: past one block of queries (1024), a window, soft cap or segment ids with
    # the queries sharded by tokens raised "0th dimension of all xs should be
    # replicated" (the map over blocks of queries), forward and gradient.
    rng = host_rng(key)
    q, k, v = (normal(rng, (1, 2048, 2, 8)) for _ in range(3))
    ex = heuristics_executor()
    ours = functools.partial(
        attention, is_causal=True, local_window_size=(64, 0), logits_soft_cap=3.0, executor=ex
    )
    theirs = functools.partial(capped_attention, cap=3.0, local_window_size=64)
    specs = (P(None, "data"), P(), P())
    assert_like_plain_jax(ours, theirs, (q, k, v), specs, (0, 1, 2))

    docs = jnp.asarray(np.repeat(np.arange(4), 512)[None], jnp.int32)

    def packed(q, k, v, q_ids, kv_ids):
        return attention(q, k, v, query_segment_ids=q_ids, kv_segment_ids=kv_ids, executor=ex)

    def packed_by_jax(q, k, v, q_ids, kv_ids):
        same = q_ids[:, None, :, None] == kv_ids[:, None, None, :]
        return jax.nn.dot_product_attention(q, k, v, mask=same)

    specs = (P(None, "data"), P(), P(), P(None, "data"), P())
    assert_like_plain_jax(packed, packed_by_jax, (q, k, v, docs, docs), specs, (0, 1, 2))


# --- softmax, layer_norm, rms_norm ----------------------------------------------------


def _along(param, x, axis):
    """A per-feature parameter shaped to broadcast along `axis` of `x`."""
    axes = {a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis)}
    return param.reshape([n if a in axes else 1 for a, n in enumerate(x.shape)])


def plain_layer_norm(x, scale, bias, *, axis):
    mean = jnp.mean(x, axis=axis, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axis, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + 1e-6)
    return y * _along(scale, x, axis) + _along(bias, x, axis)


def plain_rms_norm(x, scale, *, axis):
    ms = jnp.mean(x * x, axis=axis, keepdims=True)
    return x * jax.lax.rsqrt(ms + 1e-6) * _along(scale, x, axis)


@pytest.mark.parametrize(
    "axis, spec",
    [
        (-1, P("data", "model")),  # the rows merged both axes: P(("data", "model"))
        (1, P("data", None, "model")),  # the same, moved
        (0, P("data", None, "model")),  # the reshape to rows raised
    ],
    ids=["last", "middle", "first"],
)
def test_softmax_sharded_over_explicit_axes_is_jax_nns(key, axis, spec):
    # Before: the kernel's rows (`[rows, features]`) merged the sharded axes, so the
    # output's type read P(("data", "model"), None, None) where jax.nn.softmax keeps
    # P("data", "model", None), or the reshape raised ShardingTypeError.
    x = normal(host_rng(key), (4, 8, 32))
    ours = functools.partial(softmax, axis=axis, executor=heuristics_executor())
    theirs = functools.partial(jax.nn.softmax, axis=axis)
    assert_like_plain_jax(ours, theirs, (x,), (spec,), (0,))


@pytest.mark.parametrize(
    "axis, spec",
    [(-1, P("data", "model")), (1, P("data", None, "model")), ((1, 2), P("data", None, "model"))],
    ids=["last", "middle", "last-two"],
)
def test_norms_sharded_over_explicit_axes_are_plain_jaxs(key, axis, spec):
    # Before: normalised over an axis other than the last, the rows merged the sharded
    # axes (a different output sharding) or the reshape raised ShardingTypeError.
    rng = host_rng(key)
    x = normal(rng, (4, 8, 32))
    features = (32,) if axis == -1 else (8,) if axis == 1 else (8, 32)
    scale, bias = normal(rng, features), normal(rng, features)
    ex = heuristics_executor()
    specs = (spec, P(), P())
    assert_like_plain_jax(
        functools.partial(layer_norm, axis=axis, executor=ex),
        functools.partial(plain_layer_norm, axis=axis),
        (x, scale, bias), specs, (0, 1, 2),
    )  # fmt: skip
    assert_like_plain_jax(
        functools.partial(rms_norm, axis=axis, executor=ex),
        functools.partial(plain_rms_norm, axis=axis),
        (x, scale), specs[:2], (0, 1),
    )  # fmt: skip


def test_norms_with_the_feature_axis_sharded_keep_its_sharding(key):
    rng = host_rng(key)
    x, scale, bias = normal(rng, (4, 8, 32)), normal(rng, (32,)), normal(rng, (32,))
    ours = functools.partial(layer_norm, executor=heuristics_executor())
    theirs = functools.partial(plain_layer_norm, axis=-1)
    specs = (P("data", None, "model"), P("model"), P("model"))
    assert_like_plain_jax(ours, theirs, (x, scale, bias), specs, (0, 1, 2))


# --- matmul and the gated linear unit, where the Pallas kernels run -----------------


@pytest.fixture
def pallas_runs(monkeypatch):
    """The Pallas kernels run (in the interpreter, on a CPU), as they do on a GPU; the
    gated linear unit's heuristic picks its fused kernel, as at a GPU's large shapes."""
    monkeypatch.setenv("KERNELTUNE_PLATFORM", "triton")
    fused = GLUConfig(backend="triton", block_m=16, block_n=16, block_k=16, num_stages=2)
    monkeypatch.setattr(GatedLinearUnit, "heuristic_cfg", lambda self, inv: fused)


def plain_glu(x, w):
    gate, up = jnp.einsum("...k,kjn->...jn", x, w)[..., 0, :], x @ w[:, 1]
    return jax.nn.silu(gate) * up


@pytest.mark.parametrize(
    "x_spec, up_spec, fused_spec",
    [
        (P("data"), P(), P()),
        (P("data", "model"), P(), P()),
        (P("data"), P(None, "model"), P(None, None, "model")),
    ],
    ids=["batch", "batch+tokens", "batch+features"],
)
def test_projections_sharded_over_explicit_axes_are_plain_jaxs(
    key, pallas_runs, x_spec, up_spec, fused_spec
):
    # Before: a Pallas kernel took the call and failed on the sharded types (in the
    # interpreter a scan's carry changed type; on a GPU pallas_call raises "requires
    # all mesh axes to be Manual") where jnp.matmul runs.
    rng = host_rng(key)
    x, w = normal(rng, (4, 8, 16)), normal(rng, (16, 2, 32), scale=0.25)
    ex = heuristics_executor()
    ours = functools.partial(matmul, executor=ex)
    assert_like_plain_jax(ours, jnp.matmul, (x, w[:, 1]), (x_spec, up_spec), (0, 1))
    ours = functools.partial(gated_linear_unit, executor=ex)
    assert_like_plain_jax(ours, plain_glu, (x, w), (x_spec, fused_spec), (0, 1))


def test_ragged_dot_sharded_over_explicit_axes_is_jaxs_op(key, pallas_runs):
    # Before: the Pallas kernel took rows sharded by tokens and failed on them ("sharded
    # ref ... can only be sliced along unsharded axes"; pallas_call refuses them on a
    # GPU) where JAX's op names what it needs (an out_sharding), or runs.
    rng = host_rng(key)
    lhs, rhs = normal(rng, (32, 16)), normal(rng, (4, 16, 24))
    sizes = jnp.array([5, 11, 7, 9], jnp.int32)
    ours = functools.partial(ragged_dot, executor=heuristics_executor())
    with _SET_MESH(explicit_mesh()):
        placed = (jax.device_put(lhs, P("data")), rhs, sizes)
        try:
            want = jax.jit(jax.lax.ragged_dot)(*placed)
        except Exception as e:  # JAX has no sharding rule for it (0.10 to 0.12)
            with pytest.raises(type(e), match=re.escape(str(e).splitlines()[0])):
                jax.jit(ours)(*placed)
            return
        got = jax.jit(ours)(*placed)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim)


# --- inside shard_map ---------------------------------------------------------------


@pytest.mark.skipif(not hasattr(jax, "shard_map"), reason="needs jax.shard_map")
@pytest.mark.parametrize("manual", [("data",), ("data", "model")], ids=["data-only", "both"])
def test_ops_inside_shard_map_over_some_axes_of_an_explicit_mesh(key, manual):
    # Before, with "data" manual and "model" left explicit inside: the softmax's rows
    # and the loss head's gather over a vocabulary sharded by "model" raised
    # ShardingTypeError where plain JAX runs. Every axis manual ran, and still does.
    rng = host_rng(key)
    x = normal(rng, (4, 8, 32))
    h, w = normal(rng, (32, 16)), normal(rng, (16, 64), scale=0.25)
    labels = jnp.asarray(rng.integers(0, 64, 32), jnp.int32)
    ex = heuristics_executor()

    def per_shard(f, placed, out_spec):
        def manual_only(spec):
            return P(*(e if e in manual else None for e in spec))

        return jax.shard_map(
            f,
            mesh=explicit_mesh(),
            in_specs=tuple(manual_only(s) for s in placed),
            out_specs=manual_only(out_spec),
            axis_names=set(manual),
        )

    specs = (P("data", "model"),)
    ours = per_shard(functools.partial(softmax, executor=ex), specs, specs[0])
    assert_like_plain_jax(ours, per_shard(jax.nn.softmax, specs, specs[0]), (x,), specs, (0,))
    # The vocabulary sharded by "model" where that axis stays explicit inside.
    specs = (P("data"), P("data"), P() if "model" in manual else P(None, "model"))
    loss = functools.partial(linear_softmax_cross_entropy, reduction="none", executor=ex)
    plain = functools.partial(plain_loss, reduction="none")
    ours, theirs = per_shard(loss, specs, P("data")), per_shard(plain, specs, P("data"))
    assert_like_plain_jax(ours, theirs, (h, labels, w), specs, (0, 2))
