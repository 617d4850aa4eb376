"""What each private JAX access in `jax_compat` must find on the JAX under test, and
the fallback each one takes where JAX's layout moved.

CI runs this file on the oldest JAX allowed, on the newest for Python 3.11 and on the
newest for Python 3.12+: a release that reorganises JAX's internals fails here first."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kerneltune._src.core import jax_compat
from kerneltune._src.tuning import timing


@pytest.fixture
def fresh_profiler_state(monkeypatch):
    monkeypatch.setattr(timing, "_profiler_seen", threading.Event())
    monkeypatch.setattr(timing, "_cupti_broken", [])
    for var in timing._CUPTI_INJECTION_VARIABLES:
        monkeypatch.delenv(var, raising=False)


def test_array_impl_type_is_the_class_of_a_concrete_array():
    cls = jax_compat.array_impl_type()
    assert cls.__name__ == "ArrayImpl"
    assert isinstance(jnp.zeros(()), cls)


def test_backends_are_seen_once_an_array_exists():
    jnp.zeros(()).block_until_ready()
    assert jax_compat.backends_initialized() is True


def test_eval_context_runs_operations_eagerly_under_a_trace():
    seen = []

    def f(x):
        with jax_compat.eval_context():
            y = jnp.ones(3) * 2
        seen.append(isinstance(y, jax.core.Tracer))
        return x + y

    jax.jit(f)(jnp.zeros(3))
    assert seen == [False]


def test_distributed_client_is_none_outside_a_multi_process_job():
    from jax._src import distributed

    assert hasattr(distributed, "global_state")  # where the client is read from
    assert jax_compat.distributed_client() is None


def test_differentiation_tracers_are_the_ones_grad_wraps_inputs_in():
    types_ = jax_compat.differentiation_tracer_types()
    assert types_
    seen = []

    def f(x):
        seen.append(isinstance(x, types_))
        return x * 2.0

    jax.grad(f)(1.0)
    jax.jit(f)(1.0)
    assert seen == [True, False]


# --- the profiler ----------------------------------------------------------------------


def test_a_real_trace_is_seen_while_it_runs(tmp_path, fresh_profiler_state):
    assert jax_compat.profiler_trace_active() is False
    jax.profiler.start_trace(str(tmp_path / "a"))
    try:
        assert jax_compat.profiler_trace_active() is True
        assert timing.profiler_conflict() == "a JAX profiler trace is active"
    finally:
        jax.profiler.stop_trace()
    assert jax_compat.profiler_trace_active() is False
    with jax.profiler.trace(str(tmp_path / "b")):
        assert jax_compat.profiler_trace_active() is True
        assert timing.profiler_conflict() == "a JAX profiler trace is active"
    assert jax_compat.profiler_trace_active() is False


def test_a_profile_session_started_directly_is_seen_and_remembered(tmp_path, fresh_profiler_state):
    session_type = getattr(jax.profiler, "ProfileSession", None)
    if session_type is None:
        pytest.skip(f"jax {jax.__version__} has no jax.profiler.ProfileSession")
    timing.install_profiler_observer()
    session = session_type(log_dir=str(tmp_path)).start()
    try:
        assert timing.profiler_conflict() == "a JAX profiler trace is active"
    finally:
        session.stop()
    assert timing.profiler_conflict() == "the JAX profiler was used earlier in this process"


def test_every_way_to_start_a_trace_is_observed():
    points = jax_compat.profiler_entry_points()
    names = {name for _, name in points}
    assert {"start_trace", "start_server"} <= names
    if hasattr(jax.profiler, "ProfileSession"):  # 0.12: `trace` no longer calls start_trace
        assert any(owner is jax.profiler.ProfileSession for owner, _ in points)
    timing.install_profiler_observer()
    for owner, name in points:
        assert getattr(getattr(owner, name), "_kerneltune_observed", False), name
    assert getattr(jax.profiler.start_trace, "_kerneltune_observed", False)


def test_a_running_profiler_server_is_seen(monkeypatch, fresh_profiler_state):
    module = jax_compat.profiler_module()
    assert jax_compat.profiler_server_running() is False
    monkeypatch.setattr(module, "_profiler_server", object())
    assert jax_compat.profiler_server_running() is True
    assert timing.profiler_conflict() == "a JAX profiler server is running"


def test_an_unknown_profiler_layout_degrades_to_what_was_observed(
    monkeypatch, fresh_profiler_state
):
    monkeypatch.setattr(jax_compat, "profiler_module", lambda: None)
    assert jax_compat.profiler_trace_active() is None
    assert jax_compat.profiler_server_running() is None
    assert jax_compat.profiler_entry_points() == []
    assert timing.profiler_conflict() is None
    timing.note_profiler_used()
    assert timing.profiler_conflict() == "the JAX profiler was used earlier in this process"


def test_an_unobservable_profiler_is_named_in_one_warning(monkeypatch):
    monkeypatch.setattr(jax_compat, "profiler_entry_points", lambda: [])
    monkeypatch.setattr(timing, "_observer_unavailable_warned", False)
    with pytest.warns(RuntimeWarning, match="cannot observe the JAX profiler"):
        timing.install_profiler_observer()
    timing.install_profiler_observer()  # once: no second warning (warnings are errors here)


def test_the_function_inside_a_jitted_one_is_found_even_in_a_deep_copy():
    import copy

    def plain(x):
        return x + 1

    jitted = jax.jit(plain)
    assert jax_compat.function_inside_jit(jitted) is plain
    # A deep copy keeps no name; the function is read from its private closure.
    inner = jax_compat.function_inside_jit(copy.deepcopy(jax.nn.silu))
    assert inner is jax_compat.function_inside_jit(jax.nn.silu)
    assert inner.__name__ == "silu"
    assert jax_compat.function_inside_jit(plain) is None
    assert jax_compat.function_inside_jit(object()) is None


def test_mosaic_gpu_interpret_params_run_a_mosaic_gpu_kernel_on_the_cpu():
    params = jax_compat.mosaic_gpu_interpret_params()
    if params is None:
        pytest.skip("this JAX has no Mosaic GPU interpreter")
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def body(x_ref, o_ref, smem, bar):
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(0, 128)], smem, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        smem[...] = smem[...] * 2.0
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(0, 128)])
        plgpu.wait_smem_to_gmem(0)

    from kerneltune.kernels.attention.mosaic_flash_ops import mosaic_kernel

    x = jnp.arange(128, dtype=jnp.float32)
    out = mosaic_kernel(
        body,
        out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
        scratch_types=[plgpu.SMEM((128,), jnp.float32), plgpu.Barrier(num_barriers=1)],
        interpret=params,
    )(x)
    np.testing.assert_array_equal(out, 2 * x)


def test_outside_any_trace_is_true_only_for_eager_code():
    seen = []

    def record(x):
        seen.append(jax_compat.outside_any_trace())
        return x * 2.0

    record(1.0)
    jax.jit(record)(1.0)
    jax.grad(record)(1.0)
    jax.vmap(record)(jnp.ones(2))
    assert seen == [True, False, False, False]
