"""`ragged_dot(..., group_offset=...)` (expert parallelism): every backend that runs on
a CPU, values and both gradients against a reference built by slicing the local rows
out, for drawn shapes and offsets, at the edges, with empty local groups, under jit
and shard_map; the tile schedule's skipping; keys; errors.

The reference never uses kerneltune's code for the offset: it cuts rows `[start, end)`
out with Python integers, runs `jax.lax.ragged_dot` on them and the local groups, and
puts the result back into zeros.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import kerneltune as kt
from kerneltune.kernels import (
    RaggedDot,
    RaggedDotConfig,
    RaggedDotGradLhs,
    RaggedDotGradLhsInterpret,
    RaggedDotGradRhs,
    RaggedDotGradRhsInterpret,
    RaggedDotInterpret,
    ragged_dot,
)
from kerneltune.kernels._common import relative_error, tolerance
from kerneltune.kernels.ragged_dot import config as rc
from kerneltune.kernels.ragged_dot import pallas_mosaic, tokamax_backend
from kerneltune.kernels.ragged_dot.api import balanced_tuning_inputs
from kerneltune.kernels.ragged_dot.pallas_triton import tile_schedule
from tests.helpers import executor, heuristics_executor, normal

F32, BF16 = jnp.float32, jnp.bfloat16
SETTINGS = settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
SMALL = RaggedDotConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)
SMALL_N = RaggedDotConfig(
    block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2, tile_order="n"
)


def operands(seed, m, k, n, g_local, dtype=F32):
    rng = np.random.default_rng(seed)
    lhs = normal(rng, (m, k), dtype)
    rhs = normal(rng, (g_local, k, n), dtype)
    dout = normal(rng, (m, n))
    return lhs, rhs, dout


def local_rows(sizes, offset, g_local, m):
    """Python ints: the local groups' first row and one past their last, and their
    sizes cut to the rows there are."""
    sizes = [int(s) for s in np.asarray(sizes)]
    start = min(sum(sizes[:offset]), m)
    ends = np.minimum(start + np.cumsum(sizes[offset : offset + g_local]), m)
    local = np.diff(np.concatenate([[start], ends])).astype(np.int32)
    return start, int(ends[-1]) if g_local else start, local


def sliced_reference(lhs, rhs, sizes, offset, dout):
    """Value and gradients (of `sum(out * dout)`) by slicing, in float32 at the
    highest precision."""
    m, g_local = lhs.shape[0], rhs.shape[0]
    start, end, local = local_rows(sizes, offset, g_local, m)
    return _sliced_vjp(lhs, rhs, jnp.asarray(local), dout, start=start, end=end)


# Compiled whole: op by op, each primitive compiled alone for every drawn shape.
@functools.partial(jax.jit, static_argnames=("start", "end"))
def _sliced_vjp(lhs, rhs, local, dout, *, start, end):
    m = lhs.shape[0]

    def f(a, b):
        part = jax.lax.ragged_dot(
            a[start:end].astype(F32), b.astype(F32), local, precision=jax.lax.Precision.HIGHEST
        )
        return jnp.zeros((m, b.shape[2]), F32).at[start:end].set(part)

    out, pullback = jax.vjp(f, lhs, rhs)
    return out, pullback(dout.astype(F32))


def value_and_grads(fn, lhs, rhs, offset, dout, *, jit):
    """`fn(lhs, rhs, offset)` and the gradients of `sum(out * dout)` with respect to
    lhs and rhs; under jit the offset is traced."""

    def both(a, b, o):
        out, pullback = jax.vjp(lambda a, b: fn(a, b, o), a, b)
        return out, pullback(dout.astype(out.dtype))

    return (jax.jit(both) if jit else both)(lhs, rhs, offset)


def assert_matches(got, want, dtype=F32):
    out, grads = got
    w_out, w_grads = want
    tol = tolerance(dtype)
    assert out.shape == w_out.shape
    assert relative_error(out, w_out) <= tol, relative_error(out, w_out)
    for g, w in zip(grads, w_grads, strict=True):
        assert g.shape == w.shape
        assert relative_error(g, w) <= 2 * tol, relative_error(g, w)


def assert_zero_outside(out, d_lhs, start, end):
    for x in (out, d_lhs):
        assert not bool(jnp.any(x[:start])) and not bool(jnp.any(x[end:]))


def random_sizes(seed, m, g):
    """`g` group sizes summing to at most `m` (rows may be left over)."""
    cut = np.sort(np.random.default_rng(seed).integers(0, m + 1, g))
    return jnp.asarray(np.diff(np.concatenate([[0], cut])), jnp.int32)


# --- the interpreted Pallas kernels and the XLA path: drawn shapes --------------------


def interpreted(cfg, sizes):
    """The interpreted Pallas kernel with `cfg`, as `f(lhs, rhs, offset)`."""
    ex = heuristics_executor()
    kernel = RaggedDotInterpret(executor=ex)
    return lambda a, b, o: ex(kernel, a, b, sizes, o, cfg=cfg)


@SETTINGS
@given(
    shape=st.tuples(st.integers(1, 40), st.integers(1, 24), st.integers(1, 24)),
    groups=st.tuples(st.integers(1, 6), st.integers(1, 6)).map(lambda t: (max(t), min(t))),
    offset_pick=st.floats(0, 1),
    seed=st.integers(0, 2**16),
    jit=st.booleans(),
)
def test_pallas_values_and_gradients_match_slicing_for_drawn_shapes(
    shape, groups, offset_pick, seed, jit
):
    m, k, n = shape
    g, g_local = groups
    offset = round(offset_pick * (g - g_local))
    lhs, rhs, dout = operands(seed, m, k, n, g_local)
    sizes = random_sizes(seed, m, g)
    got = value_and_grads(interpreted(SMALL, sizes), lhs, rhs, jnp.int32(offset), dout, jit=jit)
    assert_matches(got, sliced_reference(lhs, rhs, sizes, offset, dout))
    start, end, _ = local_rows(sizes, offset, g_local, m)
    assert_zero_outside(got[0], got[1][0], start, end)


@pytest.mark.parametrize(
    ("sizes", "g_local", "offset", "cfg"),
    [
        ([5, 9, 0, 12, 7, 3], 2, 0, SMALL),  # the first experts
        ([5, 9, 0, 12, 7, 3], 2, 4, SMALL),  # the last experts (offset G - G_local)
        ([5, 9, 0, 12, 7, 3], 2, 0, SMALL_N),  # both, in the other tile order
        ([5, 9, 0, 12, 7, 3], 2, 4, SMALL_N),
        ([5, 9, 0, 0, 7, 3], 2, 2, SMALL),  # both local groups empty: every row zero
        ([0, 9, 0, 12, 0, 3], 3, 2, SMALL),  # empty groups at both edges of the local ones
        ([20, 14, 30], 3, 0, SMALL),  # G_local = G: the whole call (4 rows after the groups)
        ([17, 0, 33, 18], 1, 2, SMALL_N),  # one expert, rows before and after it
    ],
)
def test_edges_and_empty_local_groups_on_the_pallas_kernels(sizes, g_local, offset, cfg):
    m = 68
    lhs, rhs, dout = operands(len(sizes) + offset, m, 24, 40, g_local)
    sizes = jnp.asarray(sizes, jnp.int32)
    got = value_and_grads(interpreted(cfg, sizes), lhs, rhs, jnp.array([offset]), dout, jit=True)
    assert_matches(got, sliced_reference(lhs, rhs, sizes, offset, dout))
    start, end, local = local_rows(sizes, offset, g_local, m)
    assert_zero_outside(got[0], got[1][0], start, end)
    d_rhs = got[1][1]
    for i, s in enumerate(local):
        assert bool(jnp.any(d_rhs[i])) == bool(s), (i, s)  # empty group: zero slice


def test_g_local_equal_to_g_at_offset_zero_is_the_plain_call():
    lhs, rhs, dout = operands(3, 48, 16, 32, 3)
    sizes = jnp.array([10, 0, 30], jnp.int32)
    ex = heuristics_executor()
    kernel = RaggedDotInterpret(executor=ex)
    with_offset = ex(kernel, lhs, rhs, sizes, jnp.array([0]), cfg=SMALL)
    plain = ex(kernel, lhs, rhs, sizes, cfg=SMALL)
    np.testing.assert_array_equal(np.asarray(with_offset), np.asarray(plain))


def test_bfloat16_and_a_float32_output_on_the_pallas_kernels():
    lhs, rhs, dout = operands(4, 64, 32, 32, 2, dtype=BF16)
    sizes = jnp.array([8, 20, 12, 16], jnp.int32)
    ex = heuristics_executor()
    kernel = RaggedDotInterpret(executor=ex)
    want = sliced_reference(lhs, rhs, sizes, 1, dout)
    got = value_and_grads(
        lambda a, b, o: ex(kernel, a, b, sizes, o, cfg=SMALL), lhs, rhs, jnp.int32(1), dout,
        jit=True,
    )  # fmt: skip
    assert got[0].dtype == BF16 and got[1][0].dtype == BF16 and got[1][1].dtype == BF16
    assert_matches(got, want, BF16)
    wide = ex(kernel, lhs, rhs, sizes, jnp.int32(1), out_dtype=F32, cfg=SMALL)
    assert wide.dtype == F32 and relative_error(wide, want[0]) <= 1e-5


# --- every backend a CPU runs, each product on its own --------------------------------


CASE = dict(sizes=[6, 11, 0, 14, 9, 2], g_local=3, offset=2, m=48, k=24, n=16)


def _case():
    lhs, rhs, dout = operands(11, CASE["m"], CASE["k"], CASE["n"], CASE["g_local"])
    return lhs, rhs, dout, jnp.asarray(CASE["sizes"], jnp.int32), jnp.array([CASE["offset"]])


@pytest.mark.parametrize(
    ("kernel_cls", "cfg"),
    [
        (RaggedDot, rc.XLA),  # the CPU path: JAX differentiates it
        (RaggedDotInterpret, rc.XLA),
        (RaggedDotInterpret, SMALL),  # Pallas, with its two gradient kernels
        (RaggedDotInterpret, SMALL_N),
    ],
    ids=["xla", "xla-interpret", "triton", "triton-n"],
)
def test_every_cpu_backend_of_the_forward_matches_slicing(kernel_cls, cfg):
    lhs, rhs, dout, sizes, offset = _case()
    ex = heuristics_executor()
    kernel = kernel_cls(executor=ex)
    assert kernel.backend_of(cfg).name == ("triton" if cfg.backend == "triton" else "xla")
    got = value_and_grads(
        lambda a, b, o: ex(kernel, a, b, sizes, o, cfg=cfg), lhs, rhs, offset, dout, jit=True
    )
    assert_matches(got, sliced_reference(lhs, rhs, sizes, CASE["offset"], dout))


@pytest.mark.parametrize("cfg", [rc.XLA, SMALL, SMALL_N], ids=["xla", "triton", "triton-n"])
def test_the_gradient_kernels_with_an_offset_match_slicing(cfg):
    lhs, rhs, dout, sizes, offset = _case()
    _, (want_lhs, want_rhs) = sliced_reference(lhs, rhs, sizes, CASE["offset"], dout)
    ex = heuristics_executor()
    d_lhs = ex(RaggedDotGradLhsInterpret(executor=ex), dout, rhs, sizes, offset, cfg=cfg)
    d_rhs = ex(
        RaggedDotGradRhsInterpret(executor=ex), lhs, dout, sizes, offset,
        local_groups=CASE["g_local"], cfg=cfg,
    )  # fmt: skip
    assert d_rhs.shape == rhs.shape
    assert relative_error(d_lhs, want_lhs) <= tolerance(F32)
    assert relative_error(d_rhs, want_rhs) <= tolerance(F32)


def test_mosaic_and_tokamax_say_why_they_do_not_run_an_offset_call(monkeypatch):
    lhs, rhs, _, sizes, offset = _case()
    kernel = RaggedDotInterpret()
    args, kwargs = kernel.prepare(lhs, rhs, sizes, offset)
    inv = kt.Invocation(op_id=kernel.op_id, args=args, kwargs=kwargs)
    assert kernel.problem(inv).local_g == CASE["g_local"]
    assert "interpreter" in kernel.config_unusable(inv, RaggedDotConfig(backend="mosaic"))
    # tokamax's ragged_dot raises NotImplementedError for any group_offset: pruned with
    # that reason whether or not it is installed.
    assert "takes no group_offset" in kernel.config_unusable(inv, rc.TOKAMAX)
    assert tokamax_backend.unsupported(np.dtype("bfloat16"), np.dtype("bfloat16"), True) == (
        tokamax_backend.NO_OFFSET
    )
    # On a Hopper GPU, Mosaic runs the forward and d_lhs with an offset, not d_rhs.
    monkeypatch.setattr(pallas_mosaic, "is_hopper", lambda: True)
    monkeypatch.setattr(pallas_mosaic, "_load", lambda *a: pallas_mosaic.MosaicFunction(
        fn=lambda *a, **k: None, params=frozenset(["transpose_rhs"])))  # fmt: skip
    assert pallas_mosaic.unsupported("fwd", True) is None
    assert pallas_mosaic.unsupported("dlhs", True) is None
    assert pallas_mosaic.unsupported("drhs", True) == pallas_mosaic.NO_OFFSET_DRHS
    assert pallas_mosaic.unsupported("drhs", False) is None


@pytest.mark.parametrize(("g", "mosaic"), [(6, True), (8, False)], ids=["most-local", "half-local"])
def test_the_gpu_heuristic_with_an_offset(monkeypatch, g, mosaic):
    # On a Hopper GPU the heuristic is JAX's Mosaic kernel, except for d_rhs with an
    # offset (no first row: pruned), and where half the groups or fewer are local
    # (Mosaic would multiply every row: at least twice Triton's work).
    monkeypatch.setattr(pallas_mosaic, "is_hopper", lambda: True)
    monkeypatch.setattr(pallas_mosaic, "_load", lambda *a: pallas_mosaic.MosaicFunction(
        fn=lambda *a, **k: None, params=frozenset(["transpose_rhs"])))  # fmt: skip
    lhs = jax.ShapeDtypeStruct((4096, 512), BF16)
    dout = jax.ShapeDtypeStruct((4096, 256), BF16)
    rhs = jax.ShapeDtypeStruct((4, 512, 256), BF16)
    sizes, off = jax.ShapeDtypeStruct((g,), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32)
    kw = {"out_dtype": "bfloat16"}
    calls = {
        RaggedDotGradRhs: ((lhs, dout, sizes, off), {**kw, "local_groups": 4}),
        RaggedDot: ((lhs, rhs, sizes, off), kw),
        RaggedDotGradLhs: ((dout, rhs, sizes, off), kw),
    }
    for cls, (args, kwargs) in calls.items():
        kernel = cls()
        monkeypatch.setattr(kernel, "use_interpreter", lambda: False)
        inv = kt.Invocation(op_id=kernel.op_id, args=args, kwargs=kwargs)
        backend = kernel.heuristic_cfg(inv).backend
        assert backend == ("mosaic" if mosaic and cls is not RaggedDotGradRhs else "triton"), cls


def test_the_mosaic_path_computes_the_local_rows_given_jaxs_kernel_contract(monkeypatch):
    # JAX's Mosaic kernel cannot run here; a stand-in with its contract (groups from row
    # 0, the rows after the last group left unwritten: NaN here) checks what kerneltune
    # does around it: the edge groups and the zeroing.
    seen = []

    def stand_in(lhs, rhs, *, group_sizes, transpose_rhs=False, **tiles):
        seen.append(np.asarray(group_sizes).tolist())
        w = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
        out = jax.lax.ragged_dot(lhs, w, group_sizes, precision=jax.lax.Precision.HIGHEST)
        rows = jnp.arange(lhs.shape[0])[:, None]
        return jnp.where(rows < jnp.sum(group_sizes), out, jnp.nan)

    found = pallas_mosaic.MosaicFunction(fn=stand_in, params=frozenset(["transpose_rhs"]))
    monkeypatch.setattr(pallas_mosaic, "_require", lambda product: found)
    lhs, rhs, dout, sizes, offset = _case()
    cfg = RaggedDotConfig(backend="mosaic", block_m=64, block_n=64, block_k=64)
    with jax.disable_jit():  # the kernel's call is jitted: run it eagerly to read its sizes
        out = pallas_mosaic.ragged_dot_mosaic(lhs, rhs, sizes, cfg, transpose_rhs=False,
                                              group_offset=offset)  # fmt: skip
    # Groups 2..4 are rows 17..39 of 48: rows 0-16 join the first, 40-47 the last.
    assert seen[-1] == [17 + 0, 14, 9 + 8]
    want, (want_lhs, _) = sliced_reference(lhs, rhs, sizes, CASE["offset"], dout)
    assert relative_error(out, want) <= tolerance(F32)
    with jax.disable_jit():
        d_lhs = pallas_mosaic.ragged_dot_mosaic(dout, rhs, sizes, cfg, transpose_rhs=True,
                                                group_offset=offset)  # fmt: skip
    assert relative_error(d_lhs, want_lhs) <= tolerance(F32)


# --- the public function -------------------------------------------------------------


@pytest.mark.parametrize(
    "offset",
    [3, np.int64(3), jnp.array(3), jnp.array([3], jnp.int16)],
    ids=["int", "numpy", "scalar", "(1,)"],
)
def test_the_public_function_takes_every_offset_form(offset):
    lhs, rhs, dout = operands(5, 40, 16, 24, 2)
    sizes = jnp.array([4, 0, 7, 9, 6, 5], jnp.int32)
    ex = heuristics_executor()
    got = value_and_grads(
        lambda a, b, o: ragged_dot(a, b, sizes, group_offset=o, executor=ex),
        lhs, rhs, offset, dout, jit=False,
    )  # fmt: skip
    assert_matches(got, sliced_reference(lhs, rhs, sizes, 3, dout))


def test_the_public_function_under_jit_with_a_traced_offset_and_routing():
    lhs, rhs, dout = operands(6, 56, 16, 16, 2)
    ex = heuristics_executor()

    @jax.jit
    def loss_and_grads(a, b, s, o):
        def loss(a, b):
            out = ragged_dot(a, b, s, group_offset=o, executor=ex)
            return jnp.sum(out * dout), out

        return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(a, b)

    for sizes, offset in (
        ([10, 10, 10, 10, 10], 0),
        ([3, 30, 0, 9, 11], 3),
        ([0, 0, 40, 16, 0], 1),
    ):
        s = jnp.asarray(sizes, jnp.int32)
        (_, out), grads = loss_and_grads(lhs, rhs, s, jnp.int32(offset))
        assert_matches((out, grads), sliced_reference(lhs, rhs, s, offset, dout))
    assert loss_and_grads._cache_size() == 1  # one program for every offset and routing


def test_calls_the_kernels_do_not_take_still_honour_the_offset():
    lhs, rhs, _ = operands(7, 24, 8, 8, 2)
    sizes = jnp.array([5, 6, 7, 2], jnp.int16)
    start, end, local = local_rows(sizes, 1, 2, 24)
    for kwargs, (a, b) in (
        ({"precision": jax.lax.Precision.HIGHEST}, (lhs, rhs)),
        ({"preferred_element_type": BF16}, (lhs, rhs)),
        ({}, (lhs.astype(jnp.int32), rhs.astype(jnp.int32))),
    ):
        got = ragged_dot(a, b, sizes, group_offset=1, **kwargs)
        part = jax.lax.ragged_dot(a[start:end], b, jnp.asarray(local), **kwargs)
        want = jnp.zeros((24, 8), part.dtype).at[start:end].set(part)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize(
    ("offset", "error", "message"),
    [
        (jnp.array([1, 2]), ValueError, r"group_offset must be an int or an integer array of shape \(\) or \(1,\), got shape \(2,\)"),
        (jnp.array(1.0), TypeError, "group_offset must be an int .* got dtype float32"),
        (True, TypeError, "group_offset must be an int .* got bool True"),
        ("1", TypeError, "group_offset must be an int .* got str '1'"),
        (5, ValueError, r"group_offset must lie in \[0, G - G_local\] = \[0, 4\] \(G = 6 groups in group_sizes, G_local = 2 in rhs\), got 5"),
        (jnp.array([-1]), ValueError, r"must lie in \[0, G - G_local\] = \[0, 4\].*got -1"),
    ],
)  # fmt: skip
def test_bad_offsets_name_the_argument_the_value_and_what_is_allowed(offset, error, message):
    lhs, rhs, _ = operands(8, 12, 4, 4, 2)
    with pytest.raises(error, match=message):
        ragged_dot(lhs, rhs, jnp.array([2, 2, 2, 2, 2, 2]), group_offset=offset)


def test_more_local_experts_than_groups_and_bad_local_groups_are_refused():
    lhs, rhs, dout = operands(9, 12, 4, 4, 3)
    with pytest.raises(ValueError, match=r"G_local = 3 groups .* G_local <= G .* shape \(2,\)"):
        ragged_dot(lhs, rhs, jnp.array([6, 6]), group_offset=0)
    with pytest.raises(ValueError, match="must be 1-D"):  # without an offset, G must match
        ragged_dot(lhs, rhs, jnp.array([6, 6]))
    grad_rhs = RaggedDotGradRhsInterpret()
    sizes = jnp.array([4, 4, 4, 0])
    with pytest.raises(TypeError, match="local_groups must be the int G_local"):
        grad_rhs.prepare(lhs, dout, sizes, jnp.array([0]))
    with pytest.raises(ValueError, match=r"local_groups must lie in \[1, G\] = \[1, 4\], got 5"):
        grad_rhs.prepare(lhs, dout, sizes, jnp.array([0]), local_groups=5)
    with pytest.raises(ValueError, match="pass both or neither"):
        grad_rhs.prepare(lhs, dout, sizes, local_groups=2)


# --- keys and tuning -----------------------------------------------------------------


def test_keys_hold_g_and_g_local():
    events: list = []
    ex = executor(events=events, cache_miss_fallback="heuristics")
    kernel = RaggedDotInterpret(executor=ex)
    lhs = jnp.ones((32, 16))
    fn = jax.jit(lambda a, b, s, o: ex(kernel, a, b, s, o))
    fn(lhs, jnp.ones((2, 16, 16)), jnp.full((8,), 4, jnp.int32), jnp.array([2]))
    fn(lhs, jnp.ones((2, 16, 16)), jnp.full((8,), 4, jnp.int32), jnp.array([6]))  # same key
    fn(lhs, jnp.ones((2, 16, 16)), jnp.full((4,), 8, jnp.int32), jnp.array([0]))  # other G
    fn(lhs, jnp.ones((4, 16, 16)), jnp.full((8,), 4, jnp.int32), jnp.array([0]))  # G_local
    jax.jit(lambda a, b, s: ex(kernel, a, b, s))(
        lhs, jnp.ones((2, 16, 16)), jnp.full((2,), 16, jnp.int32)
    )  # no offset
    keys = [d["call_key"] for e, d in events if e == "heuristics"]
    assert len(keys) == len(set(keys)) == 4


def test_tuning_inputs_put_the_local_groups_in_the_middle():
    args = (
        jax.ShapeDtypeStruct((80, 8), F32),
        jax.ShapeDtypeStruct((2, 8, 8), F32),
        jax.ShapeDtypeStruct((8,), jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32),
    )
    inv = kt.Invocation(op_id="ragged_dot", args=args, kwargs={"out_dtype": "float32"})
    (lhs, _, sizes, offset), _ = balanced_tuning_inputs(inv)
    assert sizes.tolist() == [10] * 8 and offset.tolist() == [3]
    assert float(jnp.abs(lhs).sum()) > 0


def test_tuning_under_jit_picks_a_validated_candidate_for_each_product():
    events: list = []
    tuner = kt.Tuner(progress=False, iters=1, target_sample_s=1e-4)
    ex = executor(events=events, tuner=tuner)
    kernel = RaggedDotInterpret(executor=ex)
    lhs, rhs, dout = operands(10, 48, 16, 16, 2)
    sizes = jnp.array([5, 12, 20, 3], jnp.int32)
    got = value_and_grads(
        lambda a, b, o: ex(kernel, a, b, sizes, o), lhs, rhs, jnp.int32(1), dout, jit=True
    )
    assert_matches(got, sliced_reference(lhs, rhs, sizes, 1, dout))
    tuned = {d["op_id"]: d["report"] for e, d in events if e == "autotune_finish"}
    assert set(tuned) == {
        "ragged_dot-interpret@v1",
        "ragged_dot_dlhs-interpret@v1",
        "ragged_dot_drhs-interpret@v1",
    }
    for report in tuned.values():
        assert report.validated and report.best.backend == "triton"


# --- the tile schedule skips what lies outside ---------------------------------------


# One compile per drawn shape, not one per operation in it (the kernels call the
# schedule under jit too); the schedule from the local groups' first row and the one
# of the same groups renumbered to the top in that one program.
@functools.partial(jax.jit, static_argnums=(1, 2))
def schedules(local, m, block, start):
    return tile_schedule(local, m, block, start), tile_schedule(local, m, block)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=2, max_size=7),
    extra=st.integers(0, 20),
    block=st.sampled_from([4, 16]),
    data=st.data(),
)
def test_only_tiles_of_local_rows_compute_and_every_row_is_stored_once(sizes, extra, block, data):
    g = len(sizes)
    g_local = data.draw(st.integers(1, g))
    offset = data.draw(st.integers(0, g - g_local))
    m = sum(sizes) + extra
    if m == 0:
        return
    start, end, local = local_rows(sizes, offset, g_local, m)
    schedule, renumbered_schedule = schedules(jnp.asarray(local), m, block, jnp.int32(start))
    group, tile, lo, hi = (np.asarray(a) for a in schedule)
    stored = np.zeros(m, int)
    owner = np.full(m, -1)
    for grp, t, a, b in zip(group, tile, lo, hi, strict=True):
        rows = np.arange(t * block, t * block + block)
        mine = rows[(rows >= a) & (rows < b)]
        stored[mine] += 1
        owner[mine] = grp
        if grp < g_local and b > a:  # a program that multiplies: local rows only
            assert start <= a and b <= end
    assert (stored == 1).all()
    want = np.full(m, g_local)  # the zero "group"
    want[start:end] = np.repeat(np.arange(g_local), local)
    np.testing.assert_array_equal(owner, want)
    # As many programs multiply as for the same groups renumbered to the top, give or
    # take the alignment of each group's first row.
    renumbered = np.asarray(renumbered_schedule[0])
    computing = int(((group < g_local) & (hi > lo)).sum())
    assert computing <= int((renumbered < g_local).sum()) + g_local
    assert len(group) == -(-m // block) + g_local + 1


# --- expert parallelism under shard_map ----------------------------------------------


def _shard_map():
    fn = getattr(jax, "shard_map", None)
    if fn is None:  # jax < 0.7
        from jax.experimental.shard_map import shard_map as fn
    return fn


@pytest.mark.parametrize("pallas", [False, True], ids=["xla", "pallas-interpret"])
def test_experts_sharded_over_devices_with_the_offset_from_axis_index(pallas):
    devices = jax.devices()
    if len(devices) < 4:
        pytest.skip("needs 4 devices (the test configuration makes 4 CPU devices)")
    mesh = Mesh(np.array(devices[:4]), ("expert",))
    g, k, n, m = 8, 16, 16, 60
    lhs, _, dout = operands(12, m, k, n, 1)
    rhs = jax.random.normal(jax.random.key(13), (g, k, n), F32)
    sizes = jnp.array([9, 0, 7, 12, 3, 10, 0, 14], jnp.int32)  # 55 of 60 rows routed
    ex = heuristics_executor()
    kernel = (RaggedDotInterpret if pallas else RaggedDot)(executor=ex)
    cfg = SMALL if pallas else None

    def per_device(a, b, s):
        offset = jax.lax.axis_index("expert") * b.shape[0]
        return jax.lax.psum(ex(kernel, a, b, s, offset, cfg=cfg), "expert")

    specs = dict(mesh=mesh, in_specs=(P(), P("expert"), P()), out_specs=P())
    try:
        sharded = _shard_map()(per_device, check_vma=False, **specs)
    except TypeError:  # older spelling
        sharded = _shard_map()(per_device, check_rep=False, **specs)

    def both(fn):
        def f(a, b):
            out, pullback = jax.vjp(lambda a, b: fn(a, b, sizes), a, b)
            return out, pullback(dout)

        return jax.jit(f)(lhs, rhs)

    out, grads = both(sharded)
    ref = lambda a, b, s: jax.lax.ragged_dot(a, b, s, precision=jax.lax.Precision.HIGHEST)  # noqa: E731
    assert_matches((out, grads), both(ref))
