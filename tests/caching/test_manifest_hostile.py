"""Manifests are data, the command line fails in one line, and kernel classes may not
take the executor's option names (issue 12 items 3, 4 and 8; issue 13 item 8)."""

import json
import os
import sys
import threading

import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune import cli
from kerneltune._src.caching import manifest
from kerneltune._src.core import keys
from kerneltune._src.kernel import recording


def one_record_manifest(kernel, *, args, kwargs):
    """A manifest document holding one hand-written (hostile) record."""
    record = {
        "device": "cpu|cpu",
        "op_id_v": "x@v0",
        "call_key": "k",
        "kernel": kernel,
        "args": {"__tuple__": args},
        "kwargs": {"__dict__": kwargs},
    }
    return {"kind": manifest.MANIFEST_KIND, "schema": manifest.MANIFEST_SCHEMA, "records": [record]}


def test_a_manifest_naming_os_system_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "ran"
    doc = one_record_manifest(
        {"target": "os:system", "init": {"__dict__": {}}},
        args=[f"touch {marker}"],
        kwargs={"f": {"__ref__": "os:system"}},
    )
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="not imported or not trusted"):
        manifest.load_manifest(path)
    doc["records"][0]["kwargs"] = {"__dict__": {}}
    path.write_text(json.dumps(doc))
    assert cli.main(["--cache-dir", str(tmp_path / "c"), "tune", str(path), "--no-progress"]) == 1
    assert "no kernel class 'os:system'" in capsys.readouterr().out
    assert not marker.exists()


def test_dry_run_imports_no_module_named_in_the_file(tmp_path, monkeypatch, capsys):
    module = tmp_path / "kt_planted_module.py"
    module.write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    doc = one_record_manifest(
        {"target": "kt_planted_module:K"},
        args=[],
        kwargs={"e": {"__enum__": "kt_planted_module:E", "name": "A"}},
    )
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    assert cli.main(["tune", str(path), "--dry-run"]) == 1
    assert "kt_planted_module" in capsys.readouterr().err
    doc["records"][0]["kwargs"] = {"__dict__": {}}
    path.write_text(json.dumps(doc))
    assert cli.main(["tune", str(path), "--dry-run"]) == 0
    assert "kt_planted_module" not in sys.modules and not (tmp_path / "imported").exists()


@pytest.mark.parametrize("content", ["[" * 3000, '{"kind": ' + "7" * 5000 + "}", None])
def test_cli_reads_hostile_inputs_in_one_line(tmp_path, capsys, content):
    path = tmp_path / "in.json"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_text(content)
    done = []
    runner = threading.Thread(
        target=lambda: done.append(
            (
                cli.main(["tune", str(path), "--dry-run"]),
                cli.main(["--cache-dir", str(tmp_path / "c"), "cache", "import", str(path)]),
                cli.main(["--cache-dir", str(tmp_path / "c"), "cache", "merge", str(path)]),
            )
        ),
        daemon=True,
    )
    runner.start()
    runner.join(30)
    assert done == [(1, 1, 1)]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("kerneltune: error:") for line in err)
    assert "Traceback" not in "".join(err)


def test_cache_clear_with_an_empty_cache_dir_clears_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNELTUNE_CACHE_DIR", str(tmp_path / "default"))
    default = kt.PersistentCache(tmp_path / "default")
    default.put("cpu|cpu", "op@v0", "k", {"b": 1})
    assert cli.main(["cache", "clear", "--yes", "--cache-dir", ""]) == 1
    assert "--cache-dir is empty" in capsys.readouterr().err
    assert len(default) == 1


@pytest.mark.parametrize("name", ["cfg", "stamp", "method", "mesh", "in_specs", "out_specs"])
def test_kernel_arguments_named_like_executor_options_are_rejected(name):
    source = f"def run(self, x, *, cfg, {name}=None):\n    return x\n"
    if name == "cfg":
        source = "def prepare(self, x, cfg=None):\n    return (x,), {}\n"
    namespace: dict = {}
    exec(source, namespace)
    method = namespace.get("run") or namespace["prepare"]
    with pytest.raises(TypeError, match=f"named {name!r}.*[Rr]ename"):
        type("Bad", (kt.Kernel,), {method.__name__: method})


def test_a_non_hex_key_builder_gives_tuning_inputs():
    class Scale(kt.Kernel):
        op_id = "hostile_scale"
        key_builder = staticmethod(lambda inv: "my-key-not-hex")

        def run(self, x, *, cfg):
            return x

        def heuristic_cfg(self, inv):
            return {"b": 1}

    kernel = Scale()
    inv = kt.Invocation("hostile_scale", (jnp.ones(3),), {}, key_builder=kernel.key_builder)
    args, _ = kernel.tuning_inputs(inv)
    assert args[0].shape == (3,)
    assert keys.seed_of("my-key-not-hex") == keys.seed_of("my-key-not-hex")
    assert keys.seed_of("0000000a" + "0" * 24) == 10


def test_kernels_are_found_in_the_registry_only():
    class Registered(kt.Kernel):
        op_id = "hostile_registered"

    name = f"{Registered.__module__}:{Registered.__qualname__}"
    assert recording.KernelRef(name).build().op_id == "hostile_registered"
    with pytest.raises(LookupError, match="--import json"):
        recording.KernelRef("json:JSONDecoder").build()


def test_keys_and_manifests_spell_values_with_one_codec():
    import jax
    import numpy as np

    mesh = jax.sharding.AbstractMesh((2, 2), ("x", "y"))
    values = [
        mesh,
        jax.sharding.PartitionSpec("x", None),
        (1, 2.5, "a", None),
        {"b": [1, 2]},
        np.dtype("float32"),
        jax.ShapeDtypeStruct((3, 4), np.float32),
        jnp.sin,
        jax.nn.relu,  # a jitted function, by name
    ]
    for value in values:
        assert keys._to_plain(value) == manifest.encode(value), value
    assert manifest.encode(mesh)["__mesh__"] == ["x", "y"]
    assert keys._to_plain(jax.nn.silu)["__ref__"].endswith(":silu")
    with pytest.raises(TypeError, match="found by name"):
        manifest.encode(json.JSONDecoder)  # a module no reader trusts


def test_tune_import_of_a_missing_module_is_one_line(tmp_path, capsys):
    path = tmp_path / "m.json"
    manifest.save_manifest(path, [])
    assert cli.main(["tune", str(path), "--import", "no_such_module_kt", "--dry-run"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("kerneltune: error: --import no_such_module_kt: ModuleNotFoundError")


def test_cache_prune_removes_entries_that_do_not_fit_a_bundled_config(tmp_path, capsys):
    from kerneltune.kernels.matmul.config import MatmulConfig

    cache = kt.PersistentCache(tmp_path)
    cache.put("cpu|cpu", "matmul@v3", "good", MatmulConfig())
    cache.put("cpu|cpu", "matmul@v3", "bad", {"bm": "64"})
    cache.put("cpu|cpu", "matmul@v3", "worse", {"bm": -1})
    ops = {e.op_id for e in cache.entries()}
    assert cli.main(["--cache-dir", str(tmp_path), "cache", "prune"]) == 0
    kept = {e.call_key for e in cache.entries()}
    assert ops == {"matmul@v3"} and kept == {"good"}, (ops, kept)


def test_cache_commands_survive_a_hostile_cache(tmp_path, capsys):
    cache = kt.PersistentCache(tmp_path)
    cache.put("cpu|cpu", "op@v0", "good", {"b": 1})
    folder = tmp_path / "configs" / "op@v0" / "zz"
    folder.mkdir(parents=True)
    (folder / "nested.json").write_text("[" * 5000)
    (folder / "digits.json").write_text("9" * 5000)
    os.mkfifo(folder / "fifo.json")
    with open(folder / "huge.json", "wb") as f:
        f.truncate(100 * 1024 * 1024)
    done = []
    base = ["--cache-dir", str(tmp_path), "cache"]
    runner = threading.Thread(
        target=lambda: done.extend(
            cli.main([*base, *argv])
            for argv in (["ls"], ["export", str(tmp_path / "out.json")], ["prune"])
        ),
        daemon=True,
    )
    runner.start()
    runner.join(60)
    assert done == [0, 0, 0]
    captured = capsys.readouterr()
    assert "1 entries" in captured.out and "exported 1 entries" in captured.out
    assert "Traceback" not in captured.err
    assert not folder.exists()  # prune removed every unusable file, then the folder
    assert [e.call_key for e in cache.entries()] == ["good"]
