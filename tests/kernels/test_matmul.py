"""The bundled Pallas matmul: config, pruning, interpreter and XLA paths, gradients."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from benchmarks.harness import program_text
from kerneltune._src.core import options
from kerneltune.kernels import Matmul, MatmulConfig, MatmulInterpret, matmul
from kerneltune.kernels._common import relative_error, tolerance
from kerneltune.kernels.matmul import config as mc
from kerneltune.kernels.matmul.pallas_triton import _grouped_tile, matmul_pallas
from kerneltune.kernels.matmul.shapes import TEST_SHAPES
from tests.helpers import FixedChooser, heuristics_executor, host_rng, normal, value_and_grads

BF16 = jnp.bfloat16


@pytest.fixture
def key():
    seed = int(np.random.SeedSequence().entropy % (2**31))
    print(f"seed {seed}")
    return jax.random.PRNGKey(seed)


def operands(key, m, k, n, dtype):
    rng = host_rng(key)
    return normal(rng, (m, k), dtype), normal(rng, (k, n), dtype)


def reference(x, y):
    return np.asarray(x, np.float64) @ np.asarray(y, np.float64)


# --- config and candidate space ------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"block_m": 96}, "MatmulConfig.block_m must be a positive power of two, got 96"),
        ({"block_k": 8}, "MatmulConfig.block_k must be at least 16"),
        ({"num_warps": 3}, "MatmulConfig.num_warps must be a positive power of two"),
        ({"num_stages": 0}, "MatmulConfig.num_stages must be a positive integer"),
    ],
)
def test_config_is_validated_where_it_is_built(fields, message):
    with pytest.raises(ValueError, match=message):
        MatmulConfig(**fields)


def test_config_is_frozen_keyword_only_and_round_trips_json():
    cfg = MatmulConfig(block_m=64, block_n=128, block_k=32, num_warps=8, num_stages=4)
    assert kt.from_json(kt.to_json(cfg), MatmulConfig) == cfg
    with pytest.raises(TypeError):
        MatmulConfig(64)  # type: ignore[misc]
    assert hash(cfg) == hash(
        MatmulConfig(block_m=64, block_n=128, block_k=32, num_warps=8, num_stages=4)
    )


def test_large_problem_keeps_only_configs_that_fit():
    p = mc.MatmulProblem(4096, 4096, 4096, np.dtype(BF16))
    kept, pruned = mc.candidates(p, smem_limit=227 * 1024)
    assert mc.heuristic(p) in kept
    assert len(kept) >= 30
    for c in kept:
        assert mc.shared_memory_bytes(p, c) <= 227 * 1024
        assert mc.accumulator_registers(c) <= 255
        assert p.m % c.block_m == 0 and p.n % c.block_n == 0 and p.k % c.block_k == 0
    reasons = " ".join(x.reason for x in pruned)
    assert "shared memory" in reasons and "registers per thread" in reasons
    assert not set(kept) & {x.cfg for x in pruned}


def test_a_smaller_shared_memory_prunes_more():
    p = mc.MatmulProblem(4096, 4096, 4096, np.dtype(BF16))
    big, _ = mc.candidates(p, smem_limit=227 * 1024)
    small, pruned = mc.candidates(p, smem_limit=99 * 1024)
    assert len(small) < len(big)
    assert any("more than the 99 KiB available" in x.reason for x in pruned)


def test_shapes_no_tile_divides_fall_back_to_the_heuristic_with_reasons():
    p = mc.MatmulProblem(100, 50, 70, np.dtype(np.float32))
    kept, pruned = mc.candidates(p)
    assert kept == [mc.heuristic(p)]
    assert any("is not a multiple of" in x.reason for x in pruned)


def test_pruned_candidates_are_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="kerneltune"):
        mc.candidates(mc.MatmulProblem(64, 64, 64, np.dtype(np.float32)))
    assert any("pruned MatmulConfig" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("m", "k", "n"), [(4096, 4096, 4096), (16, 4096, 4096), (8192, 1024, 64)])
def test_heuristic_fits_shared_memory(m, k, n):
    p = mc.MatmulProblem(m, n, k, np.dtype(BF16))
    assert mc.shared_memory_bytes(p, mc.heuristic(p)) <= mc.shared_memory_limit()


def test_grouped_tile_order_visits_every_tile_once():
    for tiles_m, tiles_n, group in [(5, 3, 2), (8, 4, 8), (3, 7, 1), (6, 6, 4)]:
        seen = {
            tuple(int(v) for v in _grouped_tile(pid, tiles_m, tiles_n, min(group, tiles_m)))
            for pid in range(tiles_m * tiles_n)
        }
        assert seen == {(i, j) for i in range(tiles_m) for j in range(tiles_n)}


# --- the Pallas kernel in the interpreter ---------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("m", "k", "n"), TEST_SHAPES)
def test_pallas_matches_reference(key, m, k, n, dtype):
    x, y = operands(key, m, k, n, dtype)
    cfg = MatmulConfig(block_m=32, block_n=32, block_k=32, group_m=2)
    out = matmul_pallas(x, y, cfg, interpret=True)
    assert out.shape == (m, n) and out.dtype == dtype
    assert relative_error(out, reference(x, y)) <= tolerance(dtype)


def test_gradients_run_the_kernel_on_transposed_problems(key):
    events: list = []
    ex = heuristics_executor(events)
    kernel = MatmulInterpret(executor=ex)
    x, y = operands(key, 64, 32, 48, jnp.float32)
    dout = jax.random.normal(jax.random.fold_in(key, 1), (64, 48), jnp.float32)

    out, (dx, dy) = value_and_grads(lambda a, b: ex(kernel, a, b), (x, y), dout)
    assert relative_error(out, reference(x, y)) <= tolerance(jnp.float32)
    assert relative_error(dx, np.asarray(dout, np.float64) @ np.asarray(y, np.float64).T) <= 1e-5
    assert relative_error(dy, np.asarray(x, np.float64).T @ np.asarray(dout, np.float64)) <= 1e-5
    keys = {d["call_key"] for e, d in events if d["op_id"] == "matmul-interpret@v3"}
    assert len(keys) == 3  # the forward and the two transposed products


def test_autotuning_picks_one_of_the_candidates_and_validates_them(key):
    events: list = []
    ex = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(),
            tuner=kt.Tuner(progress=False),
            on_event=lambda e, **d: events.append((e, d)),
        )
    )
    x, y = operands(key, 64, 64, 64, jnp.float32)
    out = ex(MatmulInterpret(executor=ex), x, y)
    assert relative_error(out, reference(x, y)) <= tolerance(jnp.float32)
    (report,) = [d["report"] for e, d in events if e == "autotune_finish"]
    allowed = mc.interpret_candidates(mc.MatmulProblem(64, 64, 64, np.dtype(np.float32)))
    assert report.best in allowed
    assert report.validated and not report.failures


def test_forcing_the_triton_backend_on_a_cpu_runs_the_interpreter(key):
    x, y = operands(key, 64, 32, 32, jnp.float32)
    ex = heuristics_executor()
    with options.scoped(platform="triton"):
        out = ex(Matmul(executor=ex), x, y, cfg=MatmulConfig(block_m=32, block_n=32, block_k=32))
    assert relative_error(out, reference(x, y)) <= tolerance(jnp.float32)


# --- the XLA path and the public function ---------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["f32", "bf16"])
def test_public_matmul_flattens_leading_dims(key, dtype):
    a, b = jax.random.split(key)
    x = jax.random.normal(a, (2, 3, 64), jnp.float32).astype(dtype)
    y = jax.random.normal(b, (64, 16), jnp.float32).astype(dtype)
    out = matmul(x, y, executor=heuristics_executor())
    assert out.shape == (2, 3, 16) and out.dtype == dtype
    ref = np.einsum("abk,kn->abn", np.asarray(x, np.float64), np.asarray(y, np.float64))
    assert relative_error(out, ref) <= tolerance(dtype)


def test_xla_path_gradients(key):
    x, y = operands(key, 16, 32, 8, jnp.float32)
    ex = heuristics_executor()
    g = jax.jit(jax.grad(lambda a, b: jnp.sum(matmul(a, b, executor=ex) ** 2), argnums=(0, 1)))(
        x, y
    )
    gr = jax.jit(jax.grad(lambda a, b: jnp.sum((a @ b) ** 2), argnums=(0, 1)))(x, y)
    for a, b in zip(g, gr):
        assert relative_error(a, b) <= 1e-5


def test_cpu_xla_path_has_no_candidates_so_it_uses_the_heuristic(key):
    events: list = []
    ex = kt.Executor(
        kt.ConfigSelectorChain(kt.ConfigCache(), on_event=lambda e, **d: events.append(e))
    )
    x, y = operands(key, 32, 32, 32, jnp.float32)
    ex(Matmul(executor=ex), x, y)
    assert "heuristics" in events and "autotune_start" not in events


@pytest.mark.parametrize(
    ("x", "y", "error"),
    [
        (jnp.ones((4, 3)), jnp.ones((4, 3)), ValueError),
        (jnp.ones((4,)), jnp.ones((4, 3)), ValueError),
        (jnp.ones((4, 3)), jnp.ones((3, 2), BF16), TypeError),
        (jnp.ones((4, 3), jnp.int32), jnp.ones((3, 2), jnp.int32), TypeError),
    ],
)
def test_bad_operands_are_rejected_with_a_clear_error(x, y, error):
    with pytest.raises(error, match="matmul"):
        heuristics_executor()(Matmul(), x, y)


# --- XLA's choice on N-D operands ---------------------------------------------------------


def _train_step(mm):
    return jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.tanh(mm(x, w))), argnums=(0, 1)))


def test_xla_choice_compiles_plain_jaxs_program_on_nd_operands(key):
    # A [B, T, D] @ [D, F] call keyed as the 2-D product ran jnp.dot on the flattened
    # arrays, a different program from plain JAX's (XLA laid out the weight gradients
    # differently: 0.977x plain in a GPT block's step on an H100). Under a trace, XLA's
    # choice now runs on the N-D arrays: the same optimised program as `x @ w`.
    x, w = operands(key, 6, 32, 16, jnp.float32)
    x = x.reshape(2, 3, 32)
    chooser = FixedChooser(MatmulConfig(backend="xla"))
    ex = kt.Executor(chooser)
    ours = program_text(_train_step(lambda a, b: matmul(a, b, executor=ex)), (x, w))
    assert ours == program_text(_train_step(jnp.matmul), (x, w))
    assert chooser.calls == 1  # chosen once, for the 2-D key
    g = _train_step(lambda a, b: matmul(a, b, executor=ex))(x, w)
    for ours_g, plain_g in zip(g, _train_step(jnp.matmul)(x, w)):
        np.testing.assert_array_equal(ours_g, plain_g)


def test_other_choices_still_run_the_kernel_on_the_flattened_operands(key):
    x, w = operands(key, 6, 32, 16, jnp.float32)
    x = x.reshape(2, 3, 32)
    ex = kt.Executor(FixedChooser(MatmulConfig(block_m=32, block_n=32, block_k=32)))
    with options.scoped(platform="triton"):  # the Pallas kernel, in the interpreter
        jaxpr = str(jax.make_jaxpr(lambda a: matmul(a, w, executor=ex))(x))
        g = jax.jit(jax.grad(lambda a: jnp.sum(matmul(a, w, executor=ex) ** 2)))(x)
    assert "reshape" in jaxpr and "pallas_call" in jaxpr
    want = jax.jit(jax.grad(lambda a: jnp.sum((a @ w) ** 2)))(x)  # the reference compiled whole
    assert relative_error(g, want) <= 1e-5


def test_nd_xla_calls_are_recorded_and_labelled_like_any_call(key):
    from kerneltune._src.kernel import recording

    x, w = operands(key, 6, 32, 16, jnp.float32)
    x = x.reshape(2, 3, 32)
    ex = kt.Executor(FixedChooser(MatmulConfig(backend="xla")))
    recording.clear_invocations()
    with recording.record_calls():
        text = jax.jit(lambda a, b: matmul(a, b, executor=ex)).lower(x, w).as_text()
    records = recording.iter_records(recording.get_invocations())
    assert [r.op_id_v.split("@")[0] for r in records] == ["matmul"]
    assert "f32[6,32]" in records[0].signature  # keyed as the 2-D product
    assert "kerneltune" in text  # the call's label is in the program


def test_call_traced_refuses_concrete_arrays():
    ex = kt.Executor(FixedChooser(MatmulConfig(backend="xla")))
    with pytest.raises(ValueError, match="call_traced is for calls under jit"):
        ex.call_traced(Matmul(), jnp.ones((4, 4)), jnp.ones((4, 4)), own=lambda cfg: None)


# --- jnp.matmul's own arguments and errors ---------------------------------------------


def test_public_matmul_takes_out_sharding_as_jnp_matmul_does(key):
    # Before: `out_sharding`, a keyword of jnp.matmul, was an unexpected keyword.
    x, w = operands(key, 8, 4, 8, jnp.float32)
    explicit = jax.sharding.AxisType.Explicit
    mesh = jax.make_mesh((4,), ("x",), axis_types=(explicit,))
    spec = jax.sharding.PartitionSpec(None, "x")
    with jax.set_mesh(mesh):
        x = jax.device_put(x, jax.sharding.PartitionSpec("x", None))
        got = matmul(x, w, out_sharding=spec, executor=heuristics_executor())
        want = jnp.matmul(x, w, out_sharding=spec)
    assert got.sharding.spec == want.sharding.spec == spec
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_public_matmul_hands_reduction_order_to_the_installed_jnp_matmul(key):
    # Where jnp.matmul has `reduction_order` (JAX 0.11 and later) it judges the value;
    # an older jnp.matmul refuses the keyword. Before: ours refused it in every JAX.
    x, w = operands(key, 4, 8, 4, jnp.float32)

    def error_of(fn):
        try:
            fn(x, w, reduction_order="no such order")
        except Exception as e:
            return type(e)
        return None

    assert error_of(jnp.matmul) is not None
    assert error_of(matmul) is error_of(jnp.matmul)


def test_mismatched_contracting_dimensions_raise_jnp_matmuls_type_error():
    # Before: a ValueError; jnp.matmul raises TypeError (from lax.dot_general), so a
    # test written against jnp.matmul's error failed on ours.
    for a, b in (((3, 5), (4, 2)), ((3, 5), (4,)), ((2, 3, 5), (4, 2))):
        with pytest.raises(TypeError):
            jnp.matmul(jnp.ones(a), jnp.ones(b))
        with pytest.raises(TypeError, match=r"matmul: a's last dimension \(5\) must equal b's"):
            matmul(jnp.ones(a), jnp.ones(b))


def test_operands_that_do_not_promote_are_refused_before_their_shapes_as_in_jnp():
    # Under strict promotion float32 @ bfloat16 is an error of its own; jnp.matmul
    # reports it before a shape mismatch (before: ours reported the shapes).
    a, b = jnp.ones((4, 8)), jnp.ones((4, 8), BF16)
    with jax.numpy_dtype_promotion("strict"):
        with pytest.raises(Exception) as theirs:
            jnp.matmul(a, b)
        with pytest.raises(Exception) as ours:
            matmul(a, b)
    assert ours.type is theirs.type is jax.dtypes.TypePromotionError
