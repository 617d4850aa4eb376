"""vmap_with_config / pmap_with_config: one config for the whole batch, tuned once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune._src.workflows.batch import pmap_with_config, vmap_with_config
from tests.helpers import rand
from tests.offline_kernels import CHEAPEST, HEURISTIC, LoopKernel, started, tuning_executor


def test_vmap_with_config_tunes_once_for_the_whole_batch():
    ex, events = tuning_executor()
    f = vmap_with_config(LoopKernel(), executor=ex)
    x = rand((6, 64, 64), seed=0)
    out = f(x, alpha=0.5)
    np.testing.assert_allclose(out, x * 0.5, rtol=1e-6)
    (tuned,) = started(events)
    # The key is the one of a single element (the mapped axis removed).
    inv = ex.invocation(LoopKernel(), x[0], alpha=0.5)
    assert tuned["call_key"] == inv.call_key
    assert f.choose_config(x, alpha=0.5) == CHEAPEST
    again = f(x + 1.0, alpha=0.5)
    np.testing.assert_allclose(again, (x + 1.0) * 0.5, rtol=1e-6)
    jitted = jax.jit(lambda x: f(x, alpha=0.5))(x)
    np.testing.assert_allclose(jitted, x * 0.5, rtol=1e-6)
    assert len(started(events)) == 1
    # Every element ran with the tuned config (it is in the stamped label).
    lowered = jax.jit(lambda x: f(x, alpha=0.5)).lower(x)
    assert {lab.call_key for lab in kt_labels(lowered)} == {inv.call_key}


def kt_labels(lowered):
    from kerneltune._src.core import labels

    return labels.kernel_labels_in_lowered(lowered)


def test_vmap_with_config_in_axes_and_unmapped_arguments():
    class AddKernel(LoopKernel):
        op_id = "add_loop"

        def run(self, x, y, *, cfg):
            return super().run(x, cfg=cfg) + y

    ex, events = tuning_executor(fallback="heuristics")
    x = rand((8, 8, 5), seed=1)
    y = rand((8, 8), seed=2)
    f = vmap_with_config(AddKernel(), in_axes=(2, None), executor=ex)
    out = f(x, y)
    expected = jax.vmap(lambda a: a + y, in_axes=2)(x)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert [e for e, _ in events] == ["heuristics"]
    assert f.choose_config(x, y) == HEURISTIC
    with pytest.raises(ValueError, match="in_axes has 1 entries for 2"):
        vmap_with_config(AddKernel(), in_axes=(0,), executor=ex)(x, y)
    with pytest.raises(TypeError, match="in_axes entries must be ints"):
        vmap_with_config(AddKernel(), in_axes="0")


def test_pmap_with_config_tunes_once_for_every_device():
    n = jax.local_device_count()
    assert n >= 2
    ex, events = tuning_executor()
    f = pmap_with_config(LoopKernel(), executor=ex)
    x = rand((n, 64, 64), seed=3)
    out = f(x, alpha=2.0)
    np.testing.assert_allclose(out, x * 2.0, rtol=1e-6)
    assert len(out.sharding.device_set) == n
    np.testing.assert_allclose(f(x * 3.0, alpha=2.0), x * 6.0, rtol=1e-6)
    (tuned,) = started(events)
    inv = ex.invocation(LoopKernel(), x[0], alpha=2.0)
    assert tuned["call_key"] == inv.call_key
    assert f.choose_config(x, alpha=2.0) == CHEAPEST


def test_batched_wrappers_use_the_default_executor(monkeypatch):
    ex, events = tuning_executor(fallback="heuristics")
    monkeypatch.setattr(kt._src.execution.default, "_default", ex)
    out = vmap_with_config(LoopKernel())(jnp.ones((2, 4, 4)))
    np.testing.assert_allclose(out, jnp.ones((2, 4, 4)))
    assert [e for e, _ in events] == ["heuristics"]


def test_batched_calls_are_recorded_per_element():
    from kerneltune._src.kernel import recording

    recording.clear_invocations()
    ex, _ = tuning_executor(fallback="heuristics")
    f = vmap_with_config(LoopKernel(), executor=ex)
    x = jnp.ones((3, 4, 4))
    f(x)
    with recording.record_calls():
        f(x)
    (record,) = recording.get_invocations()["loop@v0"].values()
    assert record.signature == "f32[4,4]"
    recording.clear_invocations()


@pytest.mark.parametrize("wrap", [vmap_with_config, pmap_with_config])
def test_equal_static_values_of_other_types_do_not_share_a_batched_program(wrap):
    # 2 == 2.0 == True, and (2,) == (2.0,), but the kernel's result depends on the type.
    class Fill(kt.Kernel):
        op_id = "fill_batched"

        def run(self, x, *, cfg, value=2):
            return jnp.broadcast_to(jnp.asarray(value), x.shape)

        def heuristic_cfg(self, inv):
            return HEURISTIC

    ex, _ = tuning_executor()
    f = wrap(Fill(), executor=ex)
    x = rand((2, 3))
    for _ in range(2):
        assert f(x, value=2).dtype == jnp.int32
        assert f(x, value=2.0).dtype == jnp.float32
        assert f(x, value=True).dtype == jnp.bool_
        assert f(x, value=(2, 2, 2)).dtype == jnp.int32
        assert f(x, value=(2.0, 2, 2)).dtype == jnp.float32


def test_a_kernel_attribute_set_after_a_batched_call_is_seen_by_the_next_call():
    # Before: the wrapper's programs, traced with the old attribute, kept running it.
    class AddShift(kt.Kernel):
        op_id = "batch_shift_attr"

        def __init__(self, shift):
            super().__init__()
            self.shift = shift

        def heuristic_cfg(self, inv):
            return HEURISTIC

        def run(self, x, *, cfg):
            return x + self.shift

    k = AddShift(1.0)
    batched = vmap_with_config(
        k, executor=kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache(), autotune=False))
    )
    x = rand((2, 3))
    np.testing.assert_allclose(batched(x), x + 1.0, rtol=1e-6)
    np.testing.assert_allclose(batched(x), x + 1.0, rtol=1e-6)
    k.shift = 4.0
    np.testing.assert_allclose(batched(x), x + 4.0, rtol=1e-6)
