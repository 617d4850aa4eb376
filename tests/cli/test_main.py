"""The `kerneltune` command: info and cache commands, exit statuses, usage errors."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.tuning.report import CandidateResult, TuningReport
from kerneltune.cli import main
from tests.helpers import ROOT

DEV = "cpu|cpu"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Blocks:
    block_m: int
    block_n: int
    num_warps: int = 4


def _report(best: Blocks) -> TuningReport:
    heuristic = Blocks(block_m=32, block_n=32)
    return TuningReport(
        best=best,
        candidates=(
            CandidateResult(cfg=best, time_s=1.0e-3, samples_s=(1.0e-3, 1.2e-3)),
            CandidateResult(cfg=heuristic, time_s=2.5e-3, samples_s=(2.5e-3,)),
            CandidateResult(cfg=Blocks(block_m=512, block_n=512), status="oom", error="OOM"),
        ),
        timer="wallclock",
        heuristic_cfg=heuristic,
        heuristic_time_s=2.5e-3,
        wall_s=0.4,
    )


@pytest.fixture
def cache_dir(tmp_path):
    path = tmp_path / "cache"
    cache = PersistentCache(path)
    for i, m in enumerate((64, 128)):
        cfg = Blocks(block_m=m, block_n=64)
        signature = f"f32[{m * 8},256], f32[256,64]"
        cache.put(DEV, "matmul@v1", f"aaaa{i}key", cfg, report=_report(cfg), signature=signature)
    cache.put(DEV, "softmax@v2", "bbbbkey", {"block": 256}, signature="bf16[4096]")
    return str(path)


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


def test_info(capsys, cache_dir):
    status, out, _ = run(capsys, "--cache-dir", cache_dir, "info")
    assert status == 0
    assert "fingerprint   cpu|cpu" in out
    assert cache_dir in out and "entries       3" in out
    assert "jax" in out and "KERNELTUNE_CACHE_DIR" in out


def test_info_when_the_cache_is_off(capsys, monkeypatch):
    monkeypatch.setenv("KERNELTUNE_CACHE_DIR", "off")
    status, out, _ = run(capsys, "info")
    assert status == 0 and "off" in out


def test_a_bad_environment_variable_is_an_error_not_a_traceback(capsys, monkeypatch):
    monkeypatch.setenv("KERNELTUNE_AUTOTUNE", "sometimes")
    status, _, err = run(capsys, "info")
    assert status == 1 and "KERNELTUNE_AUTOTUNE='sometimes'" in err
    monkeypatch.setenv("KERNELTUNE_CACHE_DIR", "")
    status, _, err = run(capsys, "cache", "ls")
    assert status == 1 and "KERNELTUNE_CACHE_DIR" in err


def test_ls(capsys, cache_dir):
    status, out, _ = run(capsys, "--cache-dir", cache_dir, "cache", "ls")
    assert status == 0
    header, *rows = out.splitlines()
    assert header.split()[:6] == ["op", "shapes", "config", "time", "speedup", "age"]
    assert any("matmul@v1" in r and "f32[512,256]" in r and "block_m=64" in r for r in rows)
    assert any("2.50x" in r and "1 ms" in r for r in rows)
    assert any("softmax@v2" in r and "bf16[4096]" in r for r in rows)
    assert rows[-1] == "3 entries"


def test_ls_filters_by_op_and_accepts_the_option_after_the_command(capsys, cache_dir):
    status, out, _ = run(capsys, "cache", "ls", "--op", "softmax", "--cache-dir", cache_dir)
    assert status == 0 and "softmax@v2" in out and "matmul" not in out
    status, out, _ = run(capsys, "cache", "ls", "--op", "nothing", "--cache-dir", cache_dir)
    assert status == 0 and "no entries" in out


def test_show(capsys, cache_dir):
    status, out, _ = run(capsys, "--cache-dir", cache_dir, "cache", "show", "aaaa1")
    assert status == 0
    assert "aaaa1key" in out and "block_m=128" in out and "2.50x" in out
    assert "oom" in out and "OOM" in out and "candidates (3)" in out

    status, out, _ = run(capsys, "--cache-dir", cache_dir, "cache", "show", "bbbb", "--json")
    assert status == 0 and json.loads(out)["cfg"] == {"block": 256}

    status, _, err = run(capsys, "--cache-dir", cache_dir, "cache", "show", "zzz")
    assert status == 1 and "no entry" in err
    status, _, err = run(capsys, "--cache-dir", cache_dir, "cache", "show", "aaaa", "--json")
    assert status == 1 and "2 entries match" in err


def test_export_import_merge(capsys, cache_dir, tmp_path):
    out_file = str(tmp_path / "out.json")
    status, out, _ = run(capsys, "--cache-dir", cache_dir, "cache", "export", out_file)
    assert status == 0 and "exported 3 entries" in out

    other = str(tmp_path / "other")
    status, out, _ = run(capsys, "--cache-dir", other, "cache", "import", out_file)
    assert status == 0 and "imported 3 entries" in out
    entry = PersistentCache(other).get_entry(DEV, "matmul@v1", "aaaa0key")
    assert entry.provenance == "imported"

    third = str(tmp_path / "third")
    status, out, _ = run(capsys, "--cache-dir", third, "cache", "merge", cache_dir, out_file)
    assert status == 0 and "merged 3 entries" in out
    assert len(PersistentCache(third)) == 3
    # Sources after an option are sources too (they were "unrecognized arguments").
    fourth = str(tmp_path / "fourth")
    status, out, err = run(capsys, "cache", "merge", cache_dir, "--cache-dir", fourth, out_file)
    assert status == 0 and "merged 3 entries" in out, err
    assert len(PersistentCache(fourth)) == 3

    status, _, err = run(capsys, "--cache-dir", other, "cache", "import", str(tmp_path / "no.json"))
    assert status == 1 and "cannot import" in err and "no.json" in err
    # Of several sources, the error names the one that is not an export.
    (tmp_path / "notes.json").write_text('{"kind": "notes"}')
    bad = str(tmp_path / "notes.json")
    status, _, err = run(capsys, "--cache-dir", other, "cache", "merge", out_file, bad)
    assert status == 1 and f"cannot merge: {bad}: not a kerneltune cache export" in err


def test_clear_and_prune(capsys, cache_dir):
    status, out, _ = run(capsys, "--cache-dir", cache_dir, "cache", "clear", "--op", "matmul")
    assert status == 0 and "removed 2 entries" in out
    status, out, _ = run(capsys, "--cache-dir", cache_dir, "cache", "prune", "--older-than", "1")
    assert status == 0 and "removed 0 entries" in out
    status, out, _ = run(capsys, "--cache-dir", cache_dir, "cache", "prune", "--other-versions")
    assert status == 0 and "removed 0 entries" in out
    status, out, _ = run(capsys, "--cache-dir", cache_dir, "cache", "clear")
    assert status == 0 and "removed 1 entries" in out
    assert len(PersistentCache(cache_dir)) == 0


def test_cache_commands_when_the_cache_is_off(capsys, monkeypatch):
    monkeypatch.setenv("KERNELTUNE_CACHE_DIR", "off")
    status, _, err = run(capsys, "cache", "ls")
    assert status == 1 and "--cache-dir" in err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["cache"],
        ["cache", "bogus"],
        ["cache", "show"],
        ["cache", "ls", "--bogus"],
        ["cache", "prune", "--older-than", "-1"],
        ["cache", "prune", "--older-than", "soon"],
        ["cache", "import", "a.json", "--provenance", "heuristics"],
        ["cache", "merge"],
    ],
)
def test_usage_errors_exit_2(capsys, argv):
    status, _, err = run(capsys, *argv)
    assert status == 2
    assert err.startswith("usage: kerneltune")


def test_help_and_version(capsys):
    status, out, _ = run(capsys, "--help")
    assert status == 0 and "cache" in out and "info" in out
    status, out, _ = run(capsys, "cache", "--help")
    assert status == 0 and "export" in out and "prune" in out
    status, out, _ = run(capsys, "--version")
    assert status == 0 and out.startswith("kerneltune ")


def test_python_dash_m(cache_dir):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "kerneltune", "--cache-dir", cache_dir, "cache", "ls"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and "softmax@v2" in done.stdout, done.stderr

    command = [sys.executable, "-m", "kerneltune", "cache", "frobnicate"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert "usage:" in done.stderr and "Traceback" not in done.stderr
