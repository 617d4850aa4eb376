"""A kernel's methods are found once per (kernel class, platform, context), kept in one
frozen record, and every layer reads that record."""

import collections
import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import kerneltune as kt
from kerneltune._src.kernel import methods
from kerneltune._src.kernel.methods import NAMED_HOOKS as HOOKS
from kerneltune._src.kernel.methods import methods_of
from tests.helpers import CostKernel, RepCfg, cost_tuner, rand


@dataclasses.dataclass
class Lookups:
    """The method lookups (`_find_method` calls) by (kernel class, hook names, context
    looked in), and the records built, by (kernel class, context)."""

    found: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    built: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def of(self, cls):
        found = {k[1:]: n for k, n in self.found.items() if k[0] is cls}
        built = {k[1]: n for k, n in self.built.items() if k[0] is cls}
        return found, built

    def clear(self):
        self.found.clear()
        self.built.clear()


@pytest.fixture
def lookups(monkeypatch):
    counts = Lookups()
    find, build = methods._find_method, methods._named

    def counted_find(cls, hooks, context, backend, device):
        counts.found[(cls, tuple(hooks), context)] += 1
        return find(cls, hooks, context, backend, device)

    def counted_build(cls, platform, device, context):
        counts.built[(cls, context)] += 1
        return build(cls, platform, device, context)

    monkeypatch.setattr(methods, "_find_method", counted_find)
    monkeypatch.setattr(methods, "_named", counted_build)
    return counts


def chain(persistent=None, **policy):
    return kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(**policy),
        tuner=cost_tuner(progress=False),
        persistent=persistent,
    )


class Sized(CostKernel):
    op_id = "methods_sized"

    def tuning_inputs(self, inv):
        return super().tuning_inputs(inv)

    def reference(self, x):
        return x


def test_one_tuning_looks_up_each_method_once_and_a_cache_hit_none(lookups, tmp_path):
    class Tuned(Sized):
        pass

    persistent = kt.PersistentCache(tmp_path)
    ex = kt.Executor(chain(persistent))
    x = rand((16, 16))
    # Traced, so the tuning builds its inputs with `tuning_inputs`; then run eagerly.
    assert jax.jit(lambda x: ex(Tuned(), x))(x).shape == (16, 16)
    assert ex.chooser.report_for(*_key(ex, Tuned(), x)) is not None  # it was tuned
    ex(Tuned(), x)
    found, built = lookups.of(Tuned)
    assert built == {None: 1}
    assert found == {(hooks, None): 1 for hooks in HOOKS.values()}

    # Hits: the memory cache under a new trace, the persistent cache in a new chain
    # (its config type, usability and trace check), a new instance of the class.
    lookups.clear()
    jax.jit(lambda x: ex(Tuned(), x) + 1)(x)
    other = kt.Executor(chain(persistent, cache_miss_fallback="error"))
    assert other.chooser.decide(other.invocation(Tuned(), x), Tuned()).tier == "persistent"
    other(Tuned(), x)
    assert not lookups.found and not lookups.built


def test_a_sharded_call_looks_up_its_own_context_once(lookups):
    class Sharded(Sized):
        pass

    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    ex = kt.Executor(chain())
    call = {"method": "shard_map", "mesh": mesh, "in_specs": (P("x"),), "out_specs": P("x")}
    ex(Sharded(), rand((16, 16)), **call)
    ex(Sharded(), rand((8, 8)), **call)
    found, built = lookups.of(Sharded)
    assert set(built.values()) == {1} and "shard_map" in built, built
    assert sum(found.values()) == len(HOOKS) * len(built)
    # Every hook, the candidates included, is looked up in the call's context.
    assert found[(HOOKS["candidates"], "shard_map")] == 1


def test_the_record_is_frozen_shared_by_instances_and_per_platform(monkeypatch):
    class Platforms(Sized):
        config_type = RepCfg

        def run_triton(self, x, *, cfg):
            return x

    found = methods_of(Platforms())
    assert found is methods_of(Platforms())
    assert (name(found.run), name(found.heuristic_cfg), name(found.candidates)) == (
        "run",
        "heuristic_cfg",
        "candidate_cfgs",
    )
    assert (name(found.reference), name(found.tuning_inputs), found.vjp) == (
        "reference",
        "tuning_inputs",
        None,
    )
    assert found.config_type is RepCfg and found.platform == "xla"
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.run = None
    monkeypatch.setenv("KERNELTUNE_PLATFORM", "triton")
    assert name(methods_of(Platforms()).run) == "run_triton"
    assert methods_of(Platforms(), "shard_map") is not methods_of(Platforms())


def name(hook):
    return None if hook is None else hook.__name__


def test_bound_binds_a_recorded_name_to_an_instance():
    kernel = Sized()
    assert methods.bound(kernel, methods_of(kernel).heuristic_cfg)(None) == RepCfg(reps=4)
    assert methods.bound(kernel, None) is None


def _key(ex, kernel, *args):
    inv = ex.invocation(kernel, *args)
    return inv.device_fingerprint, inv.op_id_v, inv.call_key


# --- the executor's own keyword names ------------------------------------------------


@pytest.mark.parametrize(
    "hook, signature",
    [
        ("run", "(self, x, *, cfg, stamp=None)"),
        ("run_xla", "(self, x, *, cfg, mesh=None)"),
        ("prepare", "(self, x, method=None)"),
        ("fwd_with_residuals", "(self, x, *, cfg, mesh=None)"),
        ("vjp_triton", "(self, res, out, dout, x, *, cfg, in_specs=None)"),
        ("reference", "(self, x, *, cfg)"),
    ],
)
def test_a_kernel_taking_one_of_the_executors_names_is_refused_when_defined(hook, signature):
    # Before: only `run*` and `prepare*` were checked; a `fwd_with_residuals(..., mesh=)`
    # or `reference(..., cfg=)` was accepted, its argument silently taken by the executor.
    namespace: dict = {}
    exec(f"def {hook}{signature}:\n    return x", namespace)
    body = {"op_id": "reserved_probe", hook: namespace[hook]}
    if hook != "run":
        body["run"] = lambda self, x, *, cfg: x
    with pytest.raises(TypeError, match=f"{hook} has a parameter named"):
        type("Reserved", (kt.Kernel,), body)


def test_a_helper_named_like_a_hook_keeps_its_own_parameter_names():
    # Only hooks and their platform and context variants receive a call's keyword
    # arguments; a helper such as `run_blocks(..., method=)` is the kernel's own code.
    class Helpers(kt.Kernel):
        op_id = "reserved_helpers"

        def run(self, x, *, cfg):
            return self.run_blocks(x, method="rows")

        def run_blocks(self, x, *, method):
            return x

        def prepare_mesh(self, mesh):
            return mesh

    assert Helpers.op_id == "reserved_helpers"
    with pytest.raises(TypeError, match="run_shard_map_cpu has a parameter named 'mesh'"):

        class Variant(kt.Kernel):
            op_id = "reserved_variant"

            def run_shard_map_cpu(self, x, *, cfg, mesh=None):
                return x


def test_the_config_is_a_hooks_own_cfg_where_it_receives_one():
    class Fine(kt.Kernel):
        op_id = "reserved_fine"

        def run(self, x, *, cfg):
            return x

        def fwd_with_residuals(self, x, *, cfg):
            return x, ()

        def vjp(self, res, out, dout, x, *, cfg):
            return (dout,)

    assert Fine.op_id == "reserved_fine"
