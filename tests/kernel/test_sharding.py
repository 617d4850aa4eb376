"""method="shard_map": per-shard execution and tuning; sharding-aware keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import kerneltune as kt
from kerneltune._src.caching import manifest
from kerneltune._src.kernel import recording
from kerneltune._src.kernel.sharding import per_shard_args, shard_shape
from kerneltune._src.workflows import offline
from tests.helpers import rand
from tests.offline_kernels import (
    CHEAPEST,
    HEURISTIC,
    LoopKernel,
    ShapeSpy,
    ShardAwareKernel,
    started,
    tuning_executor,
)

pytestmark = pytest.mark.usefixtures("empty_registry")


def mesh_2x2():
    return Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))


def test_shard_shapes():
    sizes = {"x": 2, "y": 2}
    assert shard_shape((8, 6, 4), P("x", None, "y"), sizes) == (4, 6, 2)
    assert shard_shape((8, 6), P(("x", "y")), sizes) == (2, 6)
    assert shard_shape((8, 6), None, sizes) == (8, 6)
    assert shard_shape((8, 6), P(), sizes) == (8, 6)
    with pytest.raises(ValueError, match="do not divide"):
        shard_shape((6, 6), P(("x", "y")), sizes)
    with pytest.raises(ValueError, match="names mesh axes \\['z'\\]"):
        shard_shape((8,), P("z"), sizes)
    mesh = mesh_2x2()
    a, b = jax.ShapeDtypeStruct((8, 4), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32)
    shards = per_shard_args((a, (b, 3)), (P("x"), (P("y"), None)), mesh)
    assert [s.shape for s in jax.tree_util.tree_leaves(shards)[:2]] == [(4, 4), (2,)]
    assert per_shard_args((a,), P(None, "y"), mesh)[0].shape == (8, 2)


def test_shard_map_runs_per_shard_and_tunes_per_shard_once():
    ex, events = tuning_executor()
    kernel, mesh = ShapeSpy(), mesh_2x2()
    x = rand((16, 32, 32), seed=0)
    call = dict(method="shard_map", mesh=mesh, in_specs=(P(("x", "y")),), out_specs=P(("x", "y")))
    out = ex(kernel, x, **call)
    np.testing.assert_allclose(out, 2.0 * x, rtol=1e-6)
    np.testing.assert_allclose(ex(kernel, x + 1.0, **call), 2.0 * (x + 1.0), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda x: ex(kernel, x, **call))(x), 2.0 * x, rtol=1e-6)
    assert len(started(events)) == 1
    # Its hooks only ever saw one shard: 16 rows over 4 devices.
    assert {shape for _, shape in kernel.seen} == {(4, 32, 32)}
    dev, key = kt.device_fingerprint(), started(events)[0]["call_key"]
    assert ex.chooser.cache.get(dev, "spy@v0", key) == CHEAPEST
    # The mesh and specs are part of the key: split another way, tuned again.
    other = dict(call, in_specs=(P("x"),), out_specs=P("x"))
    np.testing.assert_allclose(ex(kernel, x, **other), 2.0 * x, rtol=1e-6)
    assert len(started(events)) == 2
    assert started(events)[0]["call_key"] != started(events)[1]["call_key"]
    assert {shape for _, shape in kernel.seen} == {(4, 32, 32), (8, 32, 32)}


def test_run_shard_map_is_preferred_when_defined():
    ex, _ = tuning_executor(fallback="heuristics")
    x = rand((8, 4, 4), seed=1)
    out = ex(
        ShardAwareKernel(),
        x,
        method="shard_map",
        mesh=mesh_2x2(),
        in_specs=P("x"),
        out_specs=P("x"),
    )
    np.testing.assert_allclose(out, 3.0 * x, rtol=1e-6)


def test_candidate_cfgs_shard_map_is_what_a_shard_is_tuned_over():
    # SPEC's dispatch covers every hook: a kernel that defines candidates for its
    # shards (say, smaller blocks) is tuned over those, not over its unsharded ones.
    class ShardCandidates(LoopKernel):
        op_id = "shard_candidates"

        def candidate_cfgs_shard_map(self, inv):
            return [HEURISTIC, CHEAPEST]

    ex, events = tuning_executor()
    x = rand((8, 4, 4), seed=2)
    call = dict(method="shard_map", mesh=mesh_2x2(), in_specs=P("x"), out_specs=P("x"))
    ex(ShardCandidates(), x, **call)
    (finish,) = [data for name, data in events if name == "autotune_finish"]
    assert {t[0] for t in finish["timings"]} == {HEURISTIC, CHEAPEST}
    # Unsharded, the kernel's own candidates.
    assert set(ShardCandidates().candidate_cfgs(None)) > {HEURISTIC, CHEAPEST}


def test_shard_map_records_replay_from_a_manifest(tmp_path):
    ex, _ = tuning_executor(fallback="heuristics")
    kernel, mesh = LoopKernel(), mesh_2x2()
    x = rand((4, 32, 32), seed=2)
    call = dict(method="shard_map", mesh=mesh, in_specs=(P("y"),), out_specs=P("y"))
    with recording.record_calls():
        ex(kernel, x, alpha=2.0, **call)
    path = tmp_path / "m.json"
    manifest.save_manifest(path)
    (record,) = manifest.load_manifest(path)["loop@v0"].values()
    assert record.method == "shard_map" and record.in_specs == (P("y"),)
    assert dict(record.mesh.shape) == {"x": 2, "y": 2}
    chain, events = tuning_executor()[0].chooser, []
    chain.on_event = lambda event, **data: events.append((event, data))
    result = offline.autotune_recorded([record], selector=chain)
    (entry,) = result
    assert entry.cfg == CHEAPEST and started(events)[0]["call_key"] == record.call_key
    live = ex.invocation(kernel, x, alpha=2.0, **call)
    assert live.call_key == record.call_key
    with result:  # the tuned config applies to the live call
        assert ex.chooser.choose(live, kernel) == CHEAPEST
        np.testing.assert_allclose(ex(kernel, x, alpha=2.0, **call), 2.0 * x, rtol=1e-6)
    assert ex.chooser.choose(live, kernel) == HEURISTIC


def test_sharding_fingerprints_and_the_sharding_aware_key():
    class Sharded(LoopKernel):
        op_id = "sharded_loop"
        key_builder = staticmethod(kt.default_key_builder_with_sharding)

    mesh = mesh_2x2()
    x = jnp.ones((8, 8))
    rows = jax.device_put(x, NamedSharding(mesh, P("x", None)))
    cols = jax.device_put(x, NamedSharding(mesh, P(None, "y")))
    assert kt.sharding_fingerprint(x) == "single"
    assert kt.sharding_fingerprint(rows) != kt.sharding_fingerprint(cols)
    assert "x=2" in kt.sharding_fingerprint(rows)

    ex, events = tuning_executor(fallback="heuristics")
    keys = set()
    for arr in (x, rows, cols):
        inv = ex.invocation(Sharded(), arr)
        keys.add(inv.call_key)
        plain = ex.invocation(LoopKernel(), arr)
        assert plain.call_key == ex.invocation(LoopKernel(), x).call_key
    assert len(keys) == 3
    with recording.record_calls():
        np.testing.assert_allclose(ex(Sharded(), rows), x, rtol=1e-6)
    (record,) = recording.get_invocations()["sharded_loop@v0"].values()
    assert record.shardings == (kt.sharding_fingerprint(rows),)
    assert record.invocation().call_key == record.call_key


def test_a_pallas_kernel_runs_per_shard_with_its_gradient():
    # Issue 13.4: check_vma=True was forced, and JAX's check rejects every Pallas call.
    from kerneltune.kernels.normalization import RMSNormInterpret

    ex = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    x = rand((8, 32), seed=0)
    w = 1 + rand((32,), seed=1)
    call = dict(method="shard_map", mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))

    def ours(x):
        return ex(RMSNormInterpret(), x, w, eps=1e-6, **call)

    def ref(x):
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

    np.testing.assert_allclose(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        jax.grad(lambda x: (ours(x) ** 2).sum())(x),
        jax.grad(lambda x: (ref(x) ** 2).sum())(x),
        rtol=1e-4,
        atol=1e-4,
    )


def shard_map_call(mesh):
    return dict(method="shard_map", mesh=mesh, in_specs=(P("x"),), out_specs=P("x"))


def test_explain_takes_the_shard_map_options_of_the_call():
    # explain(kernel, *args, **kwargs) explains the call `executor(kernel, *args,
    # **kwargs)`: method=, mesh= and the specs are the executor's, not the kernel's.
    ex, _ = tuning_executor(fallback="heuristics")
    kernel, mesh = ShapeSpy(), mesh_2x2()
    x = rand((8, 4, 4), seed=0)
    call = shard_map_call(mesh)
    why = kt.explain(kernel, x, executor=ex, **call)
    assert why.call_key == ex.invocation(kernel, x, **call).call_key
    assert why.call_key != ex.invocation(kernel, x).call_key
    assert why.tier == "heuristics" and why.cfg == HEURISTIC
    assert {shape for _, shape in kernel.seen} == {(4, 4, 4)}  # one shard, not all 8 rows
    with pytest.raises(ValueError, match="needs mesh=, in_specs= and out_specs="):
        kt.explain(kernel, x, executor=ex, method="shard_map", mesh=mesh)


def test_compile_keeps_the_shard_map_options():
    ex, _ = tuning_executor(fallback="heuristics")
    kernel, mesh = ShardAwareKernel(), mesh_2x2()
    x = rand((8, 4, 4), seed=0)
    compiled = ex.compile(kernel, x, **shard_map_call(mesh))
    assert compiled.cfg == HEURISTIC
    assert {shape for _, shape in kernel.seen} == {(4, 4, 4)}
    np.testing.assert_allclose(compiled(x), 3.0 * x, rtol=1e-6)  # run_shard_map ran
    np.testing.assert_allclose(jax.jit(compiled)(x), 3.0 * x, rtol=1e-6)
    with pytest.raises(TypeError, match="compile"):
        compiled(x, method="shard_map")


@pytest.mark.parametrize("option", ["mesh", "in_specs", "out_specs"])
def test_shard_map_options_without_the_method_are_an_error(option):
    # Given without method="shard_map", they used to be dropped silently (the kernel
    # ran unsharded, under a key of its own).
    ex, _ = tuning_executor(fallback="heuristics")
    kernel, x = ShapeSpy(), rand((8, 4, 4), seed=0)
    value = {"mesh": mesh_2x2(), "in_specs": (P("x"),), "out_specs": P("x")}[option]
    ex(kernel, x)  # the eager fast path knows this call now
    for _ in range(2):
        with pytest.raises(ValueError, match=f"{option}= is given but method=None"):
            ex(kernel, x, **{option: value})
    with pytest.raises(ValueError, match=f"{option}= is given but method=None"):
        jax.jit(lambda x: ex(kernel, x, **{option: value}))(x)
