"""Recording: abstract, thread-safe, nothing kept alive; JSON manifests."""

import dataclasses
import enum
import gc
import json
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import kerneltune as kt
from kerneltune._src.caching import manifest
from kerneltune._src.core import options
from kerneltune._src.kernel import recording
from kerneltune._src.kernel.base import make_invocation
from tests.helpers import heuristics_executor, rand
from tests.offline_kernels import LoopKernel, ScaledKernel

pytestmark = pytest.mark.usefixtures("empty_registry")


def leaves_of(record):
    return jax.tree_util.tree_leaves((record.args, dict(record.kwargs)))


def test_eager_calls_are_recorded_abstractly_and_once():
    ex, kernel = heuristics_executor(), LoopKernel()
    x = rand((8, 8), seed=0)
    with recording.record_calls():
        ex(kernel, x, alpha=0.5)
        ex(kernel, x, alpha=0.5)
        ex(kernel, x[:4, :4], alpha=0.5)
    ex(kernel, x[:2, :2])  # not recording any more
    found = recording.get_invocations()
    assert list(found) == ["loop@v0"]
    records = list(found["loop@v0"].values())
    assert sorted(r.signature for r in records) == ["f32[4,4], alpha=0.5", "f32[8,8], alpha=0.5"]
    for r in records:
        assert r.kernel is kernel and r.device == kt.device_fingerprint()
        assert r.kwargs == {"alpha": 0.5}
        (arg,) = r.args
        assert isinstance(arg, jax.ShapeDtypeStruct) and arg.dtype == jnp.float32
        assert r.shardings == ("single",)
    assert recording.get_invocations("some|other") == {}


def test_environment_variable_turns_recording_on(monkeypatch):
    ex, kernel = heuristics_executor(), LoopKernel()
    monkeypatch.setenv("KERNELTUNE_RECORD", "1")
    ex(kernel, jnp.ones((4, 4)))
    assert len(recording.get_invocations()["loop@v0"]) == 1


def test_recording_under_jit_keeps_no_tracer_alive():
    ex, kernel = heuristics_executor(), LoopKernel()
    tracer_refs = []

    def model(x):
        tracer_refs.append(weakref.ref(x))
        return ex(kernel, x, alpha=3.0)

    with recording.record_calls():
        out = jax.jit(model)(rand((8, 8), seed=1))
    del out
    gc.collect()
    assert tracer_refs and all(ref() is None for ref in tracer_refs)
    (record,) = recording.get_invocations()["loop@v0"].values()
    for leaf in leaves_of(record):
        assert not isinstance(leaf, jax.core.Tracer)
    assert isinstance(record.args[0], jax.ShapeDtypeStruct)
    assert record.shardings == ("none",)


def test_recording_is_thread_safe():
    kernel = LoopKernel()
    # Every key is recorded by two threads at once; each must end up recorded once.
    invocations = [
        make_invocation(kernel, (jax.ShapeDtypeStruct((n, 3), jnp.float32),), {})
        for n in range(1, 201)
    ]
    barrier = threading.Barrier(8)
    kept = [[] for _ in range(8)]

    def work(i):
        barrier.wait()
        for inv in invocations[(i % 4) :: 4]:
            kept[i].append(recording.record_invocation(kernel, inv))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    found = recording.get_invocations()["loop@v0"]
    assert set(found) == {inv.call_key for inv in invocations}
    for i in range(4):  # both threads of a pair got the one stored record
        assert all(a is b for a, b in zip(kept[i], kept[i + 4], strict=True))
        assert all(found[r.call_key] is r for r in kept[i])


def test_manifest_round_trip(tmp_path):
    ex = heuristics_executor()
    loop, scaled = LoopKernel(), ScaledKernel(scale=1.5, op_id="scaled_b")
    with recording.record_calls():
        ex(loop, jnp.ones((8, 8), jnp.bfloat16), alpha=float("inf"))
        ex(scaled, jnp.ones((4, 4)))
    path = tmp_path / "manifest.json"
    assert manifest.save_manifest(path) == 2
    doc = json.loads(path.read_text())
    assert doc["kind"] == "kerneltune.manifest"
    loaded = manifest.load_manifest(path)
    original = recording.get_invocations()
    assert {op: set(calls) for op, calls in loaded.items()} == {
        op: set(calls) for op, calls in original.items()
    }
    for op, calls in original.items():
        for key, rec in calls.items():
            back = loaded[op][key]
            assert back.kernel is None and back.signature == rec.signature
            assert [(a.shape, a.dtype) for a in back.args] == [(a.shape, a.dtype) for a in rec.args]
            assert back.kwargs == rec.kwargs
            rebuilt = back.get_kernel()
            assert type(rebuilt) is type(rec.kernel) and rebuilt.op_id_v == op
            assert back.invocation().call_key == key
    (scaled_record,) = loaded["scaled_b@v0"].values()
    assert scaled_record.get_kernel().scale == 1.5


def test_unimportable_kernels_are_refused_or_skipped(tmp_path, caplog):
    class Local(LoopKernel):
        op_id = "local"

    ex = heuristics_executor()
    with recording.record_calls():
        ex(Local(), jnp.ones((2, 2)))
        ex(LoopKernel(), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match=r"local@v0.*top level of an importable module"):
        manifest.save_manifest(tmp_path / "m.json")
    assert manifest.save_manifest(tmp_path / "m.json", on_unimportable="skip") == 1
    assert "local@v0" in caplog.text
    assert list(manifest.load_manifest(tmp_path / "m.json")) == ["loop@v0"]


def test_a_changed_kernel_version_is_not_tuned_with_old_records(tmp_path):
    ex = heuristics_executor()
    with recording.record_calls():
        ex(LoopKernel(), jnp.ones((2, 2)))
    path = tmp_path / "m.json"
    manifest.save_manifest(path)
    text = path.read_text().replace("loop@v0", "loop@v9")
    path.write_text(text)
    (record,) = manifest.load_manifest(path)["loop@v9"].values()
    with pytest.raises(ValueError, match="new version"):
        record.get_kernel()


def test_bad_manifests_are_clear_errors(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a kerneltune manifest"):
        manifest.load_manifest(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        manifest.load_manifest(path)


class Color(enum.Enum):
    RED = 1


@dataclasses.dataclass(frozen=True)
class Static:
    n: int
    name: str


def test_codec_round_trips_static_values(monkeypatch):
    # This module names `Static` and `Color`: trusted as a module imported on the command
    # line is (it holds no registered kernel; before, the test passed only after a test
    # elsewhere had trusted it).
    monkeypatch.setattr(recording, "_trusted_modules", {*recording._trusted_modules, __name__})
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))
    value = {
        "t": (1, 2.5, None, "s", [True]),
        "dtype": jnp.bfloat16,
        "np_dtype": np.dtype("int8"),
        "spec": P(("x", "y"), None),
        "inf": float("-inf"),
        "enum": Color.RED,
        "dc": Static(3, "a"),
        "fn": jnp.sin,
        "array": jax.ShapeDtypeStruct((2, 3), jnp.float16),
        "keys": jax.ShapeDtypeStruct((2,), jax.random.key(0, impl="rbg").dtype),
    }
    back = manifest.decode(json.loads(json.dumps(manifest.encode(value))))
    assert back["t"] == (1, 2.5, None, "s", [True])
    assert back["dtype"] == np.dtype("bfloat16") and back["np_dtype"] == np.dtype("int8")
    assert back["spec"] == P(("x", "y"), None)
    assert back["inf"] == float("-inf") and back["enum"] is Color.RED
    assert back["dc"] == Static(3, "a") and back["fn"] is jnp.sin
    assert (back["array"].shape, back["array"].dtype) == ((2, 3), jnp.float16)
    assert back["keys"].dtype == jax.random.key(0, impl="rbg").dtype  # a typed PRNG key
    abstract = manifest.decode(manifest.encode(mesh))
    assert dict(abstract.shape) == {"x": 2, "y": 2}
    with pytest.raises(TypeError, match="cannot write"):
        manifest.encode(object())
    with pytest.raises(TypeError, match="cannot be found by name"):
        manifest.encode(lambda: None)


def test_recording_something_not_a_kernel_names_the_arguments():
    # Before: "'NoneType' object has no attribute 'device_fingerprint'".
    ex, kernel = heuristics_executor(), LoopKernel()
    inv = ex.invocation(kernel, jnp.ones((3, 3)))
    with pytest.raises(
        TypeError, match=r"record_invocation\(kernel, inv\) .*got int and Invocation"
    ):
        recording.record_invocation(3, inv)
    with pytest.raises(TypeError, match=r"got LoopKernel and NoneType"):
        recording.record_invocation(kernel, None)
    assert recording.get_invocations() == {}


def test_record_without_recording_option_is_explicit():
    ex, kernel = heuristics_executor(), LoopKernel()
    inv = ex.invocation(kernel, jnp.ones((3, 3)))
    assert not options.get("record")
    record = kt_record = recording.record_invocation(kernel, inv)
    assert recording.record_invocation(kernel, inv) is kt_record
    assert recording.get_invocations() == {"loop@v0": {inv.call_key: record}}


def test_calls_made_before_recording_are_recorded_inside_the_block():
    ex, kernel = heuristics_executor(), LoopKernel()
    x = jnp.ones((4, 4))
    jitted = jax.jit(lambda x: ex(kernel, x[:2, :2]))
    ex(kernel, x)  # now in the executor's eager dispatch table
    jitted(x)  # now in JAX's trace cache
    assert recording.get_invocations() == {}
    with recording.record_calls():
        ex(kernel, x)
        jitted(x)
    assert sorted(r.signature for r in recording.get_invocations()["loop@v0"].values()) == [
        "f32[2,2]",
        "f32[4,4]",
    ]
