"""`kerneltune demo`: tunes, fills the persistent cache, then shows the same calls
come from it; the job list and the keys it forgets before tuning."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune import kernels
from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.cli import demo


def _tiny_jobs(on_gpu):
    def mm(key):
        a, b = jax.random.split(key)
        return (jax.random.normal(a, (64, 32)), jax.random.normal(b, (32, 64))), {}

    def sm(key):
        return (jax.random.normal(key, (8, 128)),), {}

    return [
        demo.DemoJob("matmul", kernels.Matmul, "64x32x64", "float32", mm, interpret=True),
        demo.DemoJob("softmax", kernels.Softmax, "8x128", "float32", sm, interpret=True),
    ]


def test_demo_tunes_fills_the_cache_and_reads_it_back(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "jobs_for", _tiny_jobs)
    args = argparse.Namespace(cache_dir=str(tmp_path / "cache"))
    assert demo.run(args) == 0
    out = capsys.readouterr().out
    assert "pallas interpreter" in out and "timings measure the interpreter" in out
    first, second = out.split("Same calls again")
    for column in ("op", "shape", "dtype", "tried/failed", "heuristic", "tuned", "speedup"):
        assert column in first
    assert "config" in second
    assert "timed with the wallclock timer" in first
    assert "matmul " in first and "1/0" not in first
    # softmax has one candidate in the interpreter (its heuristic): nothing to tune.
    assert "nothing to tune" in first
    assert second.count("persistent") == 1 and " no " not in second
    assert max(len(line) for line in out.splitlines()) <= demo.TABLE_WIDTH
    entries = list(PersistentCache(str(tmp_path / "cache")).entries())
    assert {e.op_id for e in entries} == {"matmul-interpret@v3"}
    assert all(e.candidates and e.provenance == "autotuned" for e in entries)
    # What the demo suggests next works on what it wrote.
    assert "kerneltune report" in out and "--out report.png" in out
    from kerneltune._src.cli import report_command as report

    png = tmp_path / "report.png"
    assert (
        report.run(argparse.Namespace(cache_dir=str(tmp_path / "cache"), op=None, out=str(png)))
        == 0
    )
    assert png.read_bytes()[:4] == b"\x89PNG"

    # A second demo retunes its own keys rather than showing stale cache hits.
    assert demo.run(args) == 0
    assert "re-tuning 1 demo keys" in capsys.readouterr().out


@pytest.mark.parametrize("on_gpu", [False, True])
def test_two_shapes_per_bundled_kernel(on_gpu):
    jobs = demo.jobs_for(on_gpu)
    families = [j.op for j in jobs]
    for op in ("matmul", "attention", "layer_norm", "rms_norm", "softmax"):
        assert families.count(op) == 2
    interpreted = [j.kernel().interpret for j in jobs]
    assert all(interpreted) if not on_gpu else not any(interpreted)
    assert all(j.grad == (j.op == "attention") for j in jobs)


def test_keys_computed_from_shapes_match_the_keys_selected():
    """`_forget` deletes the keys `_keys` computes; they must be the ones a run uses
    (the backward's too)."""
    events: list = []
    ex = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(),
            policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"),
            on_event=lambda e, **d: events.append((d["op_id"], d["call_key"])),
        )
    )

    def att(key):
        q, k, v = jax.random.split(key, 3)
        return tuple(jax.random.normal(x, (1, 32, 2, 16), jnp.float32) for x in (q, k, v)), {
            "causal": True
        }

    key = jax.random.PRNGKey(0)
    job = demo.DemoJob("attention", kernels.Attention, "1x32x2x16", "float32", att, grad=True)
    demo._run_job(ex, job, key)
    assert set(demo._keys(job, key)) == set(events)
    assert {op for op, _ in events} == {"attention@v1", "attention_bwd@v1"}


def test_each_call_is_one_row_and_a_tuned_row_wins():
    # Tuning the forward selects the backward's config again and again (untuned events):
    # the table showed "nothing to tune" up to four times next to the tuned row.
    def row(op, sig, source):
        return demo.Row(op, sig, "float32", source)

    rows = [
        row("attention_bwd@v1", "1x64 (bwd)", "heuristics"),
        row("attention@v1", "1x64 (fwd)", "tuned"),
        row("attention_bwd@v1", "1x64 (bwd)", "tuned"),
        row("attention_bwd@v1", "1x64 (bwd)", "heuristics"),
        row("softmax@v1", "8x128", "heuristics"),
        row("softmax@v1", "8x128", "heuristics"),
        row("attention_bwd@v1", "1x128 (bwd)", "heuristics"),
    ]
    folded = demo.one_row_per_call(rows)
    assert [(r.op_id, r.signature, r.source) for r in folded] == [
        ("attention_bwd@v1", "1x64 (bwd)", "tuned"),
        ("attention@v1", "1x64 (fwd)", "tuned"),
        ("softmax@v1", "8x128", "heuristics"),
        ("attention_bwd@v1", "1x128 (bwd)", "heuristics"),
    ]
