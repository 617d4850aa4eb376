"""Platform dispatch: the most specific method the subclass defines, never a stub."""

import dataclasses

import pytest

import kerneltune as kt
from kerneltune._src.kernel.methods import methods_of
from tests.helpers import rand


@dataclasses.dataclass(frozen=True)
class C:
    v: int = 0


def ex():
    return kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )


class Base(kt.Kernel):
    op_id = "which"

    def heuristic_cfg(self, inv):
        return C()


class Generic(Base):
    def run(self, x, *, cfg):
        return x * 0 + 1


class WithCpu(Generic):
    def run_cpu(self, x, *, cfg):
        return x * 0 + 2


class WithXla(WithCpu):
    def run_xla(self, x, *, cfg):
        return x * 0 + 3


class WithTriton(Generic):
    def run_triton(self, x, *, cfg):
        return x * 0 + 4


def test_on_cpu_order_is_xla_then_cpu_then_run():
    x = rand((2,))
    assert float(ex()(Generic(), x)[0]) == 1
    assert float(ex()(WithCpu(), x)[0]) == 2
    assert float(ex()(WithXla(), x)[0]) == 3
    assert float(ex()(WithTriton(), x)[0]) == 1  # triton is not this platform


def test_platform_override_from_environment(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_PLATFORM", "triton")
    assert kt.get_device_platform() == "triton"
    assert methods_of(WithTriton()).run.__name__ == "run_triton"
    monkeypatch.setenv("KERNELTUNE_PLATFORM", "xla")
    assert methods_of(WithTriton()).run.__name__ == "run"


def test_base_class_hooks_are_never_returned():
    # Kernel itself defines prepare/tuning_inputs but no run/heuristic/candidates.
    found = methods_of(Base())
    assert found.run is None and found.candidates is None and found.tuning_inputs is None
    with pytest.raises(TypeError, match=r"defines no run method.*run_xla, run_cpu, run"):
        ex()(Base(), rand((2,)))


def test_config_space_is_an_alias_of_candidate_cfgs():
    class Spaced(Generic):
        def config_space(self, inv):
            return [C(1)]

    assert methods_of(Spaced()).candidates.__name__ == "config_space"


def test_shard_map_context_methods_take_precedence():
    class Sharded(Generic):
        def run_shard_map(self, x, *, cfg):
            return x

    assert methods_of(Sharded(), context="shard_map").run.__name__ == "run_shard_map"
    assert methods_of(Sharded()).run.__name__ == "run"


def test_device_helpers():
    assert kt.device_kind() == "cpu"
    assert kt.get_device_platform() == "xla"
    assert kt.device_fingerprint() == "cpu|cpu"


def test_a_config_jax_differentiates_bypasses_the_custom_vjp():
    """A config that picks a library backend (cuDNN, XLA) is differentiated by JAX,
    with the library's own backward: the kernel's custom VJP is not used."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    import kerneltune as kt

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        backend: str = "custom"

    class Square(kt.Kernel):
        op_id = "square_native_test"

        def run(self, x, *, cfg):
            return x * x

        def fwd_with_residuals(self, x, *, cfg):
            return x * x, None

        def vjp(self, residuals, out, dout, x, *, cfg):
            return (100.0 * dout,)  # deliberately not the true derivative

        def heuristic_cfg(self, inv):
            return Cfg()

        def differentiated_by_jax(self, cfg):
            return cfg.backend == "library"

    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
    )
    ex = kt.Executor(chain)
    x = jnp.float32(3.0)
    custom = jax.grad(lambda x: ex(Square(), x, cfg=Cfg("custom")))(x)
    native = jax.grad(lambda x: ex(Square(), x, cfg=Cfg("library")))(x)
    assert float(custom) == 100.0 and float(native) == 6.0
    # JAX's own derivative also differentiates twice.
    assert float(jax.grad(jax.grad(lambda x: ex(Square(), x, cfg=Cfg("library"))))(x)) == 2.0
