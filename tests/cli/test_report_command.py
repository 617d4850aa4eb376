"""`kerneltune report`: the table, failures, PNG and HTML plots, the hint without
matplotlib, and its registration in the CLI."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from kerneltune import CandidateResult, TuningReport
from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.cli import report_command as report
from kerneltune.cli import main


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tile:
    block: int
    warps: int = 4


def _report(times, failed=(), heuristic=Tile(block=64)):
    cands = [
        CandidateResult(cfg=Tile(block=b), time_s=t, samples_s=(t, t * 1.01)) for b, t in times
    ]
    cands += [
        CandidateResult(cfg=Tile(block=b), status="compile_error", error="out of shared memory")
        for b in failed
    ]
    best = min((c for c in cands if c.ok), key=lambda c: c.time_s).cfg
    h_time = next((c.time_s for c in cands if c.cfg == heuristic), None)
    return TuningReport(
        best=best,
        candidates=tuple(cands),
        timer="cupti",
        heuristic_cfg=heuristic,
        heuristic_time_s=h_time,
        wall_s=1.5,
    )


@pytest.fixture
def cache_dir(tmp_path):
    cache = PersistentCache(str(tmp_path / "cache"), fsync=False)
    r1 = _report([(32, 3e-4), (64, 2e-4), (128, 1e-4)], failed=(256,))
    cache.put(
        "NVIDIA H200|cuda 13000",
        "matmul@v1",
        "k1",
        r1.best,
        report=r1,
        signature="bf16[4096,4096], bf16[4096,4096]",
    )
    r2 = _report([(64, 5e-5), (128, 6e-5)])
    cache.put(
        "NVIDIA H200|cuda 13000", "softmax@v1", "k2", r2.best, report=r2, signature="bf16[64,512]"
    )
    return str(tmp_path / "cache")


def run(cache_dir, **kw):
    return report.run(argparse.Namespace(cache_dir=cache_dir, op=kw.get("op"), out=kw.get("out")))


def test_table_lists_every_key_with_speedup_and_failures(cache_dir, capsys):
    assert run(cache_dir) == 0
    out = capsys.readouterr().out
    assert "matmul@v1" in out and "softmax@v1" in out
    assert "bf16[4096,4096]×2" in out  # repeated arguments are counted
    assert "2.00x" in out  # heuristic 64 at 0.2 ms, winner 128 at 0.1 ms
    assert "4/1" in out  # tried/failed
    assert "block=256 warps=4: compile_error: out of shared memory" in out


def test_op_filter(cache_dir, capsys):
    assert run(cache_dir, op="softmax") == 0
    out = capsys.readouterr().out
    assert "softmax@v1" in out and "matmul@v1" not in out
    assert run(cache_dir, op="nothing") == 0
    assert "No tuned entries for op 'nothing'" in capsys.readouterr().out


def test_png_shows_the_candidates(cache_dir, tmp_path, capsys):
    # matplotlib is in the dev extra: this runs in CI (a skip would hide a broken plot).
    out = tmp_path / "r.png"
    assert run(cache_dir, out=str(out)) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
    assert "Wrote" in capsys.readouterr().out


def test_html_needs_no_matplotlib(cache_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_have_matplotlib", lambda: False)
    out = tmp_path / "r.html"
    assert run(cache_dir, out=str(out)) == 0
    page = out.read_text()
    assert "<table>" in page and "class='win'" in page and "class='fail'" in page
    assert "out of shared memory" in page


def test_without_matplotlib_the_table_and_a_hint(cache_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(report, "_have_matplotlib", lambda: False)
    assert run(cache_dir) == 0
    assert capsys.readouterr().out.rstrip().endswith(report.HINT)
    assert run(cache_dir, out=str(tmp_path / "r.png")) == 1
    assert report.HINT in capsys.readouterr().out
    assert not (tmp_path / "r.png").exists()


def test_empty_cache_says_how_to_fill_it(tmp_path, capsys):
    assert run(str(tmp_path / "empty")) == 0
    assert "kerneltune demo" in capsys.readouterr().out


def test_registered_in_the_cli(cache_dir, tmp_path, capsys):
    assert main(["report", "--cache-dir", cache_dir, "--op", "matmul"]) == 0
    assert "matmul@v1" in capsys.readouterr().out
    assert main(["report", "--cache-dir", cache_dir, "--out", str(tmp_path / "r.txt")]) == 1
    assert "--out must end in" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["r.html", "r.png"])
def test_an_unwritable_out_file_is_a_clear_error_not_a_traceback(cache_dir, tmp_path, capsys, name):
    # Before: `--out missing_dir/r.html` ended in a FileNotFoundError traceback.
    out = tmp_path / "missing_dir" / name
    assert main(["report", "--cache-dir", cache_dir, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"kerneltune: error: cannot write --out {out}" in err
    assert "No such file or directory" in err
    assert not out.exists()
