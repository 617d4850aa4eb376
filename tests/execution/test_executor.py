"""The executor: eager programs, jit/vmap, compile, overlays on jitted functions."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from tests.helpers import CostKernel, FixedChooser, RepCfg, events_recorder, names, rand


@dataclasses.dataclass(frozen=True)
class ScaleCfg:
    scale: float = 1.0


class ScaleKernel(kt.Kernel):
    """Multiplies by the config's scale: the config is visible in the output, so tests
    can see which config ran."""

    op_id = "scale"

    def run(self, x, *, cfg, offset=0.0):
        return x * cfg.scale + offset

    def heuristic_cfg(self, inv):
        return ScaleCfg(1.0)


def heuristics_executor():
    events, on_event = events_recorder()
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"),
        on_event=on_event,
    )
    return kt.Executor(chain), chain, events


def test_eager_calls_reuse_one_jitted_program_and_skip_selection():
    ex, chain, events = heuristics_executor()
    k = ScaleKernel()
    x = rand((4, 4))
    for _ in range(5):
        np.testing.assert_allclose(ex(k, x, offset=1.0), x + 1.0)
    # The first call chooses; later calls hit the eager dispatch table.
    assert names(events) == ["heuristics"]
    assert len(ex._programs) == 1


def test_eager_program_is_jitted_not_op_by_op():
    traced = []

    class Spy(ScaleKernel):
        def run(self, x, *, cfg, offset=0.0):
            traced.append(isinstance(x, jax.core.Tracer))
            return super().run(x, cfg=cfg, offset=offset)

    ex, _, _ = heuristics_executor()
    ex(Spy(), rand((3,)))
    ex(Spy(), rand((3,)))
    assert traced and all(traced)


class Spying(ScaleKernel):
    """Counts its traces; `factor` (an attribute) scales its output."""

    traces = 0

    def __init__(self, factor=1.0):
        super().__init__()
        self.factor = factor

    def run(self, x, *, cfg, offset=0.0):
        type(self).traces += 1
        return super().run(x, cfg=cfg, offset=offset) * self.factor


def test_a_kernel_made_afresh_for_each_call_shares_one_program():
    # Before: `Kernel()(x)` in a loop traced and compiled a program for every new
    # kernel object (about 50 ms a call on a CPU) and kept each in the eager table.
    import gc
    import weakref

    ex, _, _ = heuristics_executor()
    x = rand((4, 4))
    Spying.traces = 0
    for _ in range(4):
        np.testing.assert_allclose(ex(Spying(), x), x)
    assert Spying.traces == 1
    k = Spying()
    gone = weakref.ref(k)
    ex(k, x)
    del k
    gc.collect()
    assert gone() is None  # the executor does not keep the kernels it ran alive
    # A kernel kept and called again takes the eager table (no selection).
    kept = Spying()
    ex(kept, x)
    events = []
    ex.chooser.on_event = lambda e, **d: events.append(e)
    ex(kept, x)
    assert events == [] and Spying.traces == 1
    ex(kept, rand((5, 4)))  # a new shape chooses (so the hook would have seen one)
    assert events == ["heuristics"]


def test_kernels_with_different_attributes_do_not_share_a_program():
    ex, _, _ = heuristics_executor()
    x = rand((4, 4))
    np.testing.assert_allclose(ex(Spying(2.0), x), 2 * x)
    np.testing.assert_allclose(ex(Spying(3.0), x), 3 * x)
    # An attribute that does not hash by value (an array) counts by identity.
    np.testing.assert_allclose(ex(Spying(jnp.full((4, 4), 2.0)), x), 2 * x)
    np.testing.assert_allclose(ex(Spying(jnp.full((4, 4), 5.0)), x), 5 * x)


def test_only_kernels_known_by_their_values_share_a_program():
    # Review of the sharing: equal numbers of other types, -0.0 and 0.0, slots, and a
    # kernel changed after its first call must not hand their program to another.
    class Fill(ScaleKernel):
        op_id = "fill_with_attribute"

        def __init__(self, value):
            super().__init__()
            self.value = value

        def run(self, x, *, cfg, offset=0.0):
            return jnp.full(x.shape, self.value)

    ex, _, _ = heuristics_executor()
    x = jnp.ones(2)
    assert ex(Fill(2), x).dtype == jnp.int32
    assert ex(Fill(2.0), x).dtype == jnp.float32
    assert str(float(ex(Fill(0.0), x)[0])) == "0.0"
    assert str(float(ex(Fill(-0.0), x)[0])) == "-0.0"

    @dataclasses.dataclass(slots=True, eq=False)
    class Slotted(kt.Kernel):
        factor: float = 1.0
        op_id = "scale"

        def run(self, x, *, cfg):
            return x * self.factor

        def heuristic_cfg(self, inv):
            return ScaleCfg(1.0)

    np.testing.assert_allclose(ex(Slotted(2.0), x), 2 * x)
    np.testing.assert_allclose(ex(Slotted(5.0), x), 5 * x)
    first = Spying(2.0)
    ex(first, x)
    first.factor = 3.0  # the shared program traced a copy: the next equal kernel is 2x
    np.testing.assert_allclose(ex(Spying(2.0), jnp.ones(5)), 2 * jnp.ones(5))


def test_unhashable_static_values_that_json_cannot_pin_down_get_their_own_program():
    class Times:  # defines __eq__, so it does not hash; its weight is an array
        def __init__(self, w):
            self.w = w

        def __eq__(self, other):
            return isinstance(other, Times) and other.w is self.w

        def __call__(self, x):
            return x * self.w

    class Apply(ScaleKernel):
        op_id = "apply_static_callable"

        def run(self, x, *, cfg, act):
            return act(x)

    ex, _, _ = heuristics_executor()
    x = jnp.ones(2)
    np.testing.assert_allclose(ex(Apply(), x, act=Times(jnp.array(2.0))), 2 * x)
    np.testing.assert_allclose(ex(Apply(), x, act=Times(jnp.array(3.0))), 3 * x)


def test_new_shapes_and_static_values_choose_again():
    ex, chain, events = heuristics_executor()
    k = ScaleKernel()
    ex(k, rand((4,)))
    ex(k, rand((5,)))
    ex(k, rand((5,)), offset=2.0)
    ex(k, rand((5,), jnp.bfloat16))
    assert names(events).count("heuristics") == 4


def test_cache_change_invalidates_eager_table():
    ex, chain, events = heuristics_executor()
    k = ScaleKernel()
    x = rand((4,))
    np.testing.assert_allclose(ex(k, x), x)
    inv = ex.invocation(k, x)
    chain.cache.put(inv.device_fingerprint, inv.op_id_v, inv.call_key, ScaleCfg(3.0))
    np.testing.assert_allclose(ex(k, x), 3.0 * x, rtol=1e-6)


def test_custom_chooser_is_asked_every_eager_call():
    chooser = FixedChooser(ScaleCfg(2.0))
    ex = kt.Executor(chooser)
    x = rand((3,))
    for _ in range(3):
        np.testing.assert_allclose(ex(ScaleKernel(), x), 2.0 * x, rtol=1e-6)
    assert chooser.calls == 3


def test_under_jit_and_vmap_the_kernel_is_traced_inline():
    ex, _, _ = heuristics_executor()
    k = ScaleKernel()
    x = rand((3, 4))
    np.testing.assert_allclose(jax.jit(lambda a: ex(k, a, offset=1.0))(x), x + 1.0, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(lambda a: ex(k, a))(x), x, rtol=1e-6)


def test_overlay_changes_an_already_jitted_function_and_reverts():
    ex, chain, _ = heuristics_executor()
    k = ScaleKernel()
    x = rand((4,))
    f = jax.jit(lambda a: ex(k, a))
    np.testing.assert_allclose(f(x), x, rtol=1e-6)
    inv = ex.invocation(k, x)
    key = (inv.device_fingerprint, inv.op_id_v, inv.call_key)
    with kt.overlay_cache({key: ScaleCfg(5.0)}):
        np.testing.assert_allclose(f(x), 5.0 * x, rtol=1e-6)
        np.testing.assert_allclose(ex(k, x), 5.0 * x, rtol=1e-6)  # eager too
    np.testing.assert_allclose(f(x), x, rtol=1e-6)
    np.testing.assert_allclose(ex(k, x), x, rtol=1e-6)


def test_autotuning_result_context_changes_jitted_function_and_reverts():
    ex, chain, _ = heuristics_executor()
    k = ScaleKernel()
    x = rand((4,))
    f = jax.jit(lambda a: ex(k, a))
    f(x)
    inv = ex.invocation(k, x)
    result = kt.AutotuningResult(
        inv.device_fingerprint, (kt.Entry(inv.op_id_v, inv.call_key, ScaleCfg(7.0)),)
    )
    with result:
        np.testing.assert_allclose(f(x), 7.0 * x, rtol=1e-6)
        with result:  # re-entrant
            np.testing.assert_allclose(f(x), 7.0 * x, rtol=1e-6)
    np.testing.assert_allclose(f(x), x, rtol=1e-6)


def test_compile_fixes_the_config_and_keeps_prepare():
    class Prepared(ScaleKernel):
        def prepare(self, x, **kw):
            return (x.reshape(-1),), kw

    chooser = FixedChooser(ScaleCfg(2.0))
    ex = kt.Executor(chooser)
    fn = ex.compile(Prepared(), rand((2, 3)))
    assert fn.cfg == ScaleCfg(2.0)
    y = rand((2, 3))
    np.testing.assert_allclose(fn(y), 2.0 * y.reshape(-1), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(fn)(y), 2.0 * y.reshape(-1), rtol=1e-6)
    assert chooser.calls == 1


def test_kernel_call_uses_default_executor():
    kt.set_default_executor(kt.Executor(FixedChooser(ScaleCfg(4.0))))
    try:
        x = rand((3,))
        np.testing.assert_allclose(ScaleKernel()(x), 4.0 * x, rtol=1e-6)
    finally:
        kt.set_default_executor(None)


def test_default_executor_reads_policy_from_environment(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_AUTOTUNE", "error")
    kt.set_default_executor(None)
    try:
        with pytest.raises(kt.CacheMissError):
            CostKernel()(rand((4, 4)))
    finally:
        kt.set_default_executor(None)


def test_numpy_and_pytree_arguments_take_the_general_path():
    class SumKernel(kt.Kernel):
        op_id = "sum2"

        def run(self, pair, *, cfg):
            a, b = pair
            return a * cfg.scale + b

        def heuristic_cfg(self, inv):
            return ScaleCfg(2.0)

    ex, _, _ = heuristics_executor()
    a, b = np.ones(3, np.float32), rand((3,))
    np.testing.assert_allclose(ex(SumKernel(), (a, b)), 2.0 + np.asarray(b), rtol=1e-6)


def test_labels_are_stamped_in_lowered_hlo_and_compiled_text():
    ex, _, _ = heuristics_executor()
    k = ScaleKernel()
    lowered = jax.jit(lambda a, b: ex(k, a, offset=1.0) + ex(k, b, offset=2.0).sum()).lower(
        rand((4,)), rand((6,))
    )
    labels = kt.find_labels_in_lowered(lowered)
    assert len(labels) == 2 and all(lab.startswith("kerneltune:scale@v0:") for lab in labels)
    for text in (
        lowered.as_text(),
        lowered.compiler_ir("hlo").as_hlo_text(),
        lowered.compile().as_text(),
    ):
        assert set(kt.extract_labels_from_hlo_text(text)) == set(labels)


def test_stamp_none_and_json(monkeypatch):
    ex, _, _ = heuristics_executor()
    k = ScaleKernel()
    monkeypatch.setenv("KERNELTUNE_STAMP", "none")
    assert kt.find_labels_in_lowered(jax.jit(lambda a: ex(k, a)).lower(rand((4,)))) == []
    monkeypatch.setenv("KERNELTUNE_STAMP", "json")
    (lab,) = kt.find_labels_in_lowered(jax.jit(lambda a: ex(k, a)).lower(rand((4,))))
    assert lab.endswith(':{"scale":1.0}')


def test_executor_rejects_bad_arguments():
    ex, _, _ = heuristics_executor()
    with pytest.raises(TypeError, match="Kernel instance"):
        ex(lambda x: x, rand((2,)))
    with pytest.raises(ValueError, match="method must be None or 'shard_map'"):
        ex(ScaleKernel(), rand((2,)), method="pmap")
    with pytest.raises(TypeError, match="choose"):
        kt.Executor(object())


def test_costkernel_result_independent_of_config():
    ex, _, _ = heuristics_executor()
    x = rand((8, 8))
    a = ex(CostKernel(), x, cfg=RepCfg(reps=1))
    b = ex(CostKernel(), x, cfg=RepCfg(reps=4))
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_an_error_raised_by_a_cached_program_is_not_retried():
    runs = []

    class Flaky(ScaleKernel):
        op_id = "flaky"

    ex, _, _ = heuristics_executor()
    x = rand((3,))
    kernel = Flaky()
    ex(kernel, x)  # the program for this signature is now in the eager table
    (entry_key,) = list(ex._eager)

    def failing(*args):
        runs.append(1)
        raise TypeError("raised while running")

    ex._eager[entry_key] = failing
    with pytest.raises(TypeError, match="raised while running"):
        ex(kernel, x)
    assert runs == [1]


def test_stamp_is_an_executor_option_for_choose_config_invocation_and_compile():
    # Before: choose_config, invocation and compile handed `stamp=` to the kernel as a
    # keyword argument (another call key than the call's), and compile ignored it, though
    # its callable tells users to pass the executor's options to compile().
    ex, chain, _ = heuristics_executor()
    k = ScaleKernel()
    x = rand((4,))
    inv = ex.invocation(k, x, stamp=False)
    assert inv.kwargs == {} and inv.stamp is False
    assert inv.call_key == ex.invocation(k, x).call_key
    chain.cache.put(inv.device_fingerprint, inv.op_id_v, inv.call_key, ScaleCfg(3.0))
    assert ex.choose_config(k, x, stamp=False) == ScaleCfg(3.0)
    unstamped = ex.compile(k, x, stamp=False)
    assert unstamped.cfg == ScaleCfg(3.0)
    np.testing.assert_allclose(unstamped(x), 3.0 * x, rtol=1e-6)
    assert kt.find_labels_in_lowered(jax.jit(unstamped).lower(x)) == []
    stamped = ex.compile(k, x)
    assert len(kt.find_labels_in_lowered(jax.jit(stamped).lower(x))) == 1
    with pytest.raises(TypeError, match=r"stamp must be a bool, got 'no'"):
        ex(k, x, stamp="no")


def test_a_dataclass_kernel_holding_an_array_runs_eagerly():
    # Before: every eager call raised "TypeError: unhashable type: 'Weighted'": such a
    # kernel keys its program by itself, and a dataclass with eq=True (the default)
    # does not hash, nor does a frozen one holding an array.
    @dataclasses.dataclass
    class Weighted(kt.Kernel):
        w: object = None
        op_id = "weighted"

        def run(self, x, *, cfg):
            return x * jnp.asarray(self.w) * cfg.scale

        def heuristic_cfg(self, inv):
            return ScaleCfg(1.0)

    @dataclasses.dataclass(frozen=True)
    class FrozenWeighted(kt.Kernel):
        w: object = None
        op_id = "frozen_weighted"
        run, heuristic_cfg = Weighted.run, Weighted.heuristic_cfg

    ex, _, _ = heuristics_executor()
    x = rand((3,))
    for kind in (Weighted, FrozenWeighted):
        for w in (jnp.full(3, 2.0), [3.0, 3.0, 3.0]):
            kernel = kind(w)
            for _ in range(2):
                np.testing.assert_allclose(ex(kernel, x), x * jnp.asarray(w), rtol=1e-6)
            np.testing.assert_allclose(
                kt.Executor(FixedChooser(ScaleCfg(2.0)))(kernel, x),
                2.0 * x * jnp.asarray(w),
                rtol=1e-6,
            )


def test_a_kernel_known_by_identity_is_not_kept_alive_by_its_program():
    # Before: its program's key and trace held it, so a kernel holding an array made
    # afresh for each eager call stayed in memory, with its compiled program, for good.
    import gc
    import weakref

    class Plain(ScaleKernel):
        op_id = "plain_with_array"

        def __init__(self, w):
            super().__init__()
            self.w = w

        def run(self, x, *, cfg, offset=0.0):
            return x * self.w

    ex, _, _ = heuristics_executor()
    x = rand((3,))
    refs = []
    for i in range(3):
        kernel = Plain(jnp.full(3, float(i)))
        np.testing.assert_allclose(ex(kernel, x), i * x, rtol=1e-6)
        refs.append(weakref.ref(kernel))
    kept = kernel
    del kernel
    gc.collect()
    assert [r() is None for r in refs] == [True, True, False]
    assert len(ex._programs) == 1
    np.testing.assert_allclose(ex(kept, x), 2 * x, rtol=1e-6)  # its program still serves it
    np.testing.assert_allclose(jax.jit(lambda a: ex(kept, a))(x), 2 * x, rtol=1e-6)


def test_equal_static_values_of_other_types_do_not_share_an_eager_program():
    # 2 == 2.0 and True == 1 (with equal hashes), and (2,) == (2.0,), but a kernel's
    # result may depend on the type (`jnp.asarray(2.0)` is a float array): a later
    # call must not reuse the program remembered for an equal value of another type.
    class Fill(ScaleKernel):
        op_id = "fill_static"

        def run(self, x, *, cfg, value=2):
            return jnp.broadcast_to(jnp.asarray(value), x.shape)

    ex, _, _ = heuristics_executor()
    k = Fill()
    x = rand((2,))
    for _ in range(2):
        assert ex(k, x, value=2).dtype == jnp.int32
        assert ex(k, x, value=2.0).dtype == jnp.float32
        assert ex(k, x, value=True).dtype == jnp.bool_
        assert ex(k, x, value=(2,)).dtype == jnp.int32
        assert ex(k, x, value=(2.0,)).dtype == jnp.float32


class Shift(ScaleKernel):
    """Adds its attribute `shift` (a number, or an array: a kernel known by identity)."""

    op_id = "shift_attr"

    def __init__(self, shift):
        super().__init__()
        self.shift = shift

    def run(self, x, *, cfg):
        return x + self.shift


@pytest.mark.parametrize("first", [1.0, np.float32(1.0) * np.ones(3, np.float32)])
def test_a_kernel_attribute_set_after_a_call_is_seen_by_the_next_call(first):
    # Before: the eager table (keyed by the kernel's id) and the program cache kept the
    # program traced with the old attribute: after `k.shift = 5`, eager calls and even a
    # fresh jax.jit trace (whose tracers hit the same table) still added the old value.
    ex, _, _ = heuristics_executor()
    k = Shift(first)
    x = rand((3,))
    np.testing.assert_allclose(ex(k, x), x + 1.0, rtol=1e-6)
    np.testing.assert_allclose(ex(k, x), x + 1.0, rtol=1e-6)  # from the eager table
    k.shift = first * 5
    np.testing.assert_allclose(ex(k, x), x + 5.0, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda a: ex(k, a))(x), x + 5.0, rtol=1e-6)
    np.testing.assert_allclose(ex(k, x), x + 5.0, rtol=1e-6)  # remembered again
    k.shift = first * 7
    np.testing.assert_allclose(ex(k, x), x + 7.0, rtol=1e-6)
