"""`kerneltune tune MANIFEST [--shard i/n] [--out FILE]`, in another process."""

import argparse
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune import cli
from kerneltune._src.caching import manifest as manifests
from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.cli.tune_command import parse_shard, shard_records
from kerneltune._src.kernel import recording
from tests.helpers import ROOT, TESTS
from tests.offline_kernels import CANDIDATES, LoopCfg, LoopKernel, ScaledKernel


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """Three recorded calls of two kernels, written by this process."""
    recording.clear_invocations()
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
    )
    ex = kt.Executor(chain)
    with recording.record_calls():
        ex(LoopKernel(), jnp.ones((128, 128)), alpha=2.0)
        ex(LoopKernel(), jnp.ones((96, 96)))
        ex(ScaledKernel(scale=1.5, op_id="scaled_b"), jnp.ones((112, 112)))
    path = tmp_path_factory.mktemp("manifest") / "manifest.json"
    assert manifests.save_manifest(path) == 3
    keys = {(r.op_id_v, r.call_key) for r in recording.iter_records(recording.all_invocations())}
    recording.clear_invocations()
    return path, keys


def kerneltune_process(*argv):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "kerneltune", *argv],
        env=env,
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_shards_tuned_in_other_processes_cover_the_manifest_once(manifest, tmp_path):
    path, keys = manifest
    outs = [tmp_path / f"shard{i}.json" for i in range(2)]
    caches = [tmp_path / f"cache{i}" for i in range(2)]
    procs = [
        kerneltune_process(
            "--cache-dir", str(caches[i]), "tune", str(path),
            "--shard", f"{i}/2", "--out", str(outs[i]), "--no-progress",
            "--import", "tests.offline_kernels",
        )
        for i in range(2)
    ]  # fmt: skip
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stdout + stderr
        assert "3 recorded calls" in stdout and "winner" in stdout and "tuned" in stdout
    types = {"loop": LoopCfg, "scaled_b": LoopCfg}
    results = [kt.AutotuningResult.load(out, types) for out in outs]
    shard_keys = [{(e.op_id_v, e.call_key) for e in r} for r in results]
    assert shard_keys[0] and shard_keys[1]
    assert not shard_keys[0] & shard_keys[1]
    assert shard_keys[0] | shard_keys[1] == keys
    for result in results:
        assert result.device == kt.device_fingerprint()
        assert all(e.cfg in CANDIDATES and len(e.timings) == 3 for e in result)
        # The heuristic bar survives --out, so merged caches keep it in reports.
        assert all(e.heuristic_cfg is not None and e.strategy and e.wall_s for e in result)
    # Each process also filled its own persistent cache.
    assert sum(len(PersistentCache(c)) for c in caches) == len(keys)

    # The results import (and merge) into any cache with the `kerneltune cache` commands.
    shared = tmp_path / "shared"
    assert cli.main(["--cache-dir", str(shared), "cache", "import", str(outs[0])]) == 0
    assert cli.main(["--cache-dir", str(shared), "cache", "merge", str(outs[1])]) == 0
    cache = PersistentCache(shared)
    dev = kt.device_fingerprint()
    for entry in [*results[0], *results[1]]:
        assert cache.get(dev, entry.op_id_v, entry.call_key, cfg_type=LoopCfg) == entry.cfg
    # ... and apply directly, merged.
    merged = results[0] | results[1]
    with merged:
        chain = kt.ConfigSelectorChain(kt.ConfigCache(), autotune=False)
        cfg = kt.Executor(chain).choose_config(LoopKernel(), jnp.ones((96, 96)))
    (entry,) = [e for e in merged if e.signature == "f32[96,96]"]
    assert cfg == entry.cfg


def test_shards_split_deterministically_and_exactly_once():
    records = [recording.Record("d", f"op{i % 3}@v0", f"{i:04x}", (), {}) for i in range(17)]
    for n in range(1, 6):
        parts = [shard_records(list(reversed(records)), i, n) for i in range(n)]
        keys = [r.key for part in parts for r in part]
        assert sorted(keys) == sorted(r.key for r in records)
        assert len(set(keys)) == len(records)
        assert parts == [shard_records(records, i, n) for i in range(n)]
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_parse_shard():
    assert parse_shard("0/1") == (0, 1) and parse_shard("3/4") == (3, 4)
    for bad in ("2/2", "-1/2", "a/b", "1", "0/0"):
        with pytest.raises(argparse.ArgumentTypeError, match="0 <= i < n"):
            parse_shard(bad)
    assert cli.main(["tune", "m.json", "--shard", "2/2"]) == 2


def test_dry_run_lists_the_shard(manifest, capsys):
    path, keys = manifest
    assert cli.main(["tune", str(path), "--dry-run", "--shard", "1/3"]) == 0
    out = capsys.readouterr().out
    assert "shard 1/3: 1 of 3 recorded calls" in out
    assert sum(key in out for _, key in keys) == 1
    assert cli.main(["tune", str(path), "--dry-run", "--op", "scaled_b"]) == 0
    assert "1 of 1 recorded calls" in capsys.readouterr().out


def test_failures_are_reported_with_exit_status_1(manifest, tmp_path, capsys):
    path, _ = manifest
    doc = json.loads(path.read_text())
    doc["records"] = doc["records"][:1]
    doc["records"][0]["kernel"]["target"] = "no_such_module_kt:Kernel"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    out_file = tmp_path / "out.json"
    argv = ["--cache-dir", str(tmp_path / "c"), "tune", str(bad), "--out", str(out_file)]
    assert cli.main([*argv, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "failed: LookupError" in out and "1 failed" in out
    assert len(kt.AutotuningResult.load(out_file)) == 0
    assert cli.main(["tune", str(tmp_path / "missing.json")]) == 1
    assert "cannot read the manifest" in capsys.readouterr().err


def test_out_does_not_count_untuned_calls_as_tuned(tmp_path, capsys):
    # Before: "wrote 1 tuned configs" for a call with nothing to tune on a CPU (only
    # plain-JAX backends): the file holds its heuristic config, marked untuned.
    from kerneltune.kernels import softmax

    recording.clear_invocations()
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
    )
    with recording.record_calls():
        softmax(jnp.ones((8, 16)), executor=kt.Executor(chain))
    path = tmp_path / "manifest.json"
    assert manifests.save_manifest(path) == 1
    recording.clear_invocations()
    out_file = tmp_path / "out.json"
    argv = ["--cache-dir", str(tmp_path / "c"), "tune", str(path), "--out", str(out_file)]
    assert cli.main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "1 untuned" in out
    assert f"wrote 1 config to {out_file} (0 tuned, 1 untuned)" in out
    assert [e.untuned for e in kt.AutotuningResult.load(out_file)] == [True]
