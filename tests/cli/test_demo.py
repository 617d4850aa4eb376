"""`kerneltune demo` on a CPU (issue 47): a row for every bundled op with each
implementation's time, first call and peak; the peers' columns honest where a peer
cannot run; the summary; the GPU sample; the saved comparison that `kerneltune report`
plots; the keys an earlier demo tuned forgotten."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import types

import jax
import numpy as np
import pytest

from kerneltune._src.cli import demo, demo_cases, demo_results, demo_sample
from kerneltune._src.cli import report_command as report

LABELS = [c.label for c in demo_cases.cases(on_gpu=False)]


def _table(out: str, first_column: str) -> dict[str, list[str]]:
    """The rows of the table whose header starts with `first_column`, by label: the
    cells split on runs of two or more spaces; the table ends at a blank or indented
    line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{first_column}  "))
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith(" "):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture(scope="module")
def cpu_demo(tmp_path_factory):
    """The whole CPU demo once, with a short first-call budget (the path, not the
    timings, is under test): its output, exit status and cache directory."""
    cache = str(tmp_path_factory.mktemp("demo") / "cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELTUNE_FIRST_CALL_PROCESS_S", "4")
        capture = _Capture()
        mp.setattr(sys, "stdout", capture)
        status = demo.run(argparse.Namespace(cache_dir=cache, ops=None, no_tokamax=True))
    return capture.text(), status, cache


class _Capture:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(self.parts)


def test_the_cpu_demo_has_a_row_per_op_with_every_kerneltune_column_timed(cpu_demo):
    out, status, _ = cpu_demo
    assert status == 0
    assert "Pallas interpreter" in out and "they mean nothing for a GPU" in out
    times = _table(out, "op")
    assert list(times) == LABELS
    for label, cells in times.items():
        shape, pass_, plain, tokamax, untuned, chosen, x_plain, x_tokamax = cells
        for cell in (plain, untuned, chosen):
            assert re.fullmatch(r"[\d.]+ (us|ms|s)", cell), (label, cell)
        assert tokamax == "n/a" and x_tokamax == "-"
        assert re.fullmatch(r"[\d.]+x", x_plain), (label, x_plain)
    assert "tokamax: n/a: tokamax left out (--no-tokamax)" in out
    assert "tokamax: n/a: tokamax has no such op (matmul, softmax)" in out


def test_the_cpu_demo_reports_first_calls_peaks_and_where_configs_came_from(cpu_demo):
    out, _, _ = cpu_demo
    second = out[out.index("First call (wall") :]
    rows = _table(second, "op")
    assert list(rows) == LABELS
    for label, cells in rows.items():
        plain, tokamax, untuned, chosen, p_plain, p_tokamax, p_untuned, p_chosen, how = cells
        assert tokamax == "-" and p_tokamax == "-"
        for cell in (plain, untuned, chosen):
            assert re.fullmatch(r"[\d.]+ (us|ms|s)", cell), (label, cell)
        for cell in (p_plain, p_untuned, p_chosen):
            assert re.fullmatch(r"[\d.]+ (MiB|GiB)", cell), (label, cell)
        sources = ("tuned", "budget-tuned", "predicted", "heuristic", "memory", "shipped")
        assert how.split(",")[0].split()[0] in sources, (label, how)
    # The Pallas kernels ran in the interpreter: the chosen configs name Pallas backends.
    assert "triton" in rows["ragged_dot"][-1] and "pallas" in rows["attention"][-1]


def test_the_cpu_demo_summarises_and_shows_the_gpu_sample_with_its_sources(cpu_demo):
    out, _, _ = cpu_demo
    summary = next(line for line in out.splitlines() if line.startswith("Summary"))
    assert "(CPU: interpreter timings, meaningless for a GPU)" in summary
    assert "against the faster of plain JAX and tokamax" in summary
    assert all(label in summary for label in LABELS)
    assert re.search(r"First calls: kerneltune [\d.]+ s in all, plain JAX [\d.]+ s\.$", summary)
    sample = out[out.index("What the same table measured on GPUs") :]
    rows = _table(sample, "op")
    assert [r[0] for r in demo_sample.ROWS] == list(rows)
    assert rows["ragged_dot"][2:6] == ["20.8 ms", "10.5 ms", "4.23 ms", "3.46 ms"]
    assert all(re.fullmatch(r"H[12]00 \[\d\]", cells[-1]) for cells in rows.values())
    for n, (heading, _) in demo_sample.SOURCES.items():
        assert f'[{n}] BENCHMARKS.md, "{heading}' in " ".join(sample.split())


def test_the_cpu_demo_reads_back_what_it_tuned_from_the_persistent_cache(cpu_demo):
    # SPEC 7: the demo fills the persistent cache, then shows that a run from it needs
    # no tuning. A new executor over the cache reads every key this run tuned.
    out, _, cache = cpu_demo
    line = " ".join(out[out.index("Read back as the next run would") :].split("\n\n")[0].split())
    match = re.search(r"configs from (.*?); (\d+) keys tuned, ([\d.]+) s\.", line)
    assert match, line
    sources = {s: int(n) for s, n in (p.rsplit(" ", 1) for p in match.group(1).split(", "))}
    tuned = demo_results.load(cache).tuned_keys
    assert tuned and sources.get("persistent") == len({tuple(k) for k in tuned}), line
    assert match.group(2) == "0", line


def test_every_sample_source_is_a_heading_of_benchmarks_md():
    from tests.helpers import ROOT

    headings = {
        line.lstrip("#").strip()
        for line in (ROOT / "BENCHMARKS.md").read_text().splitlines()
        if line.startswith("#")
    }
    for heading, _ in demo_sample.SOURCES.values():
        assert heading in headings, heading


def test_the_comparison_is_saved_and_read_back(cpu_demo):
    out, _, cache = cpu_demo
    comparison = demo_results.load(cache)
    assert comparison is not None and comparison.interpreter and comparison.platform == "cpu"
    assert [r.label for r in comparison.rows] == LABELS
    assert comparison.rows[0].results["kt_chosen"].time_s > 0
    assert f"Saved to {demo_results.location(cache)}" in out
    again = demo_results.Comparison.from_json(comparison.to_json())
    assert again == comparison


def test_report_after_the_demo_prints_and_plots_the_comparison(cpu_demo, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _, _, cache = cpu_demo
    png = tmp_path / "report.png"
    assert report.run(argparse.Namespace(cache_dir=cache, op=None, out=str(png))) == 0
    out = capsys.readouterr().out
    assert "The last `kerneltune demo` (cpu" in out and "Summary (CPU" in out
    assert f"Wrote {png} (the demo's comparison" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    page = tmp_path / "report.html"
    assert report.run(argparse.Namespace(cache_dir=cache, op=None, out=str(page))) == 0
    assert "The last demo: cpu" in page.read_text() and "MoE layer" in page.read_text()


def test_report_with_only_the_comparison_plots_it(cpu_demo, tmp_path, capsys):
    """On a GPU the chosen configs may all come from the shipped tables: no tuned key in
    the cache, the comparison alone."""
    pytest.importorskip("matplotlib")
    _, _, cache = cpu_demo
    empty = tmp_path / "cache"
    empty.mkdir()
    (empty / demo_results.FILE).write_bytes(_read(demo_results.location(cache)))
    png = tmp_path / "only.png"
    assert report.run(argparse.Namespace(cache_dir=str(empty), op=None, out=str(png))) == 0
    assert "(the demo's comparison)" in capsys.readouterr().out
    assert png.read_bytes()[:4] == b"\x89PNG"


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_a_failing_peer_says_failed_and_a_second_demo_retunes_its_keys(
    tmp_path, monkeypatch, capsys
):
    """A tokamax whose op raises: its cells say "failed" with the error; the op it lacks
    says "n/a". The second run forgets the key the first one tuned, so its first call
    tunes again."""

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this platform")

    fake = types.ModuleType("tokamax")
    fake.__version__ = "0.0.test"
    fake.layer_norm = broken
    fake.ragged_dot = broken
    monkeypatch.setitem(sys.modules, "tokamax", fake)
    # Seconds on the wall clock: on a loaded machine 4 s ran out before the second run
    # had tuned both keys again; each key's 5 s may too.
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_PROCESS_S", "120")
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_KEY_S", "60")
    args = argparse.Namespace(
        cache_dir=str(tmp_path / "c"), ops="ragged_dot,matmul", no_tokamax=False
    )
    assert demo.run(args) == 0
    out = capsys.readouterr().out
    assert "tokamax 0.0.test" in out.splitlines()[0]
    rows = _table(out, "op")
    assert rows["ragged_dot"][3] == "failed" and rows["matmul"][3] == "n/a"
    assert "tokamax: failed: RuntimeError: no kernel for this platform (ragged_dot)" in out
    first = demo_results.load(str(tmp_path / "c"))
    assert first is not None and first.tuned_keys
    assert first.rows[0].chosen_from.startswith(("tuned", "budget-tuned"))

    assert demo.run(args) == 0
    out = capsys.readouterr().out
    forgot = len(first.tuned_keys)
    assert f"(forgot {forgot} configs an earlier demo tuned, so that first calls tune)" in out
    second = demo_results.load(str(tmp_path / "c"))
    # Every key forgotten was tuned again (the budget may let more in: it is seconds).
    assert second is not None and set(first.tuned_keys) <= set(second.tuned_keys)


def test_an_unknown_row_is_refused_with_the_names():
    from kerneltune._src.cli.errors import CommandError

    with pytest.raises(CommandError, match=r"unknown row.*'nope'.*ragged_dot,moe,attention"):
        demo.selected("moe,nope", demo_cases.cases(on_gpu=False))
    assert [c.name for c in demo.selected("softmax,moe", demo_cases.cases(False))] == [
        "moe",
        "softmax",
    ]


def test_a_row_reports_the_wall_of_each_of_its_phases(tmp_path):
    # The progress line splits a row's wall into making the inputs, the first calls and
    # the timing: where a demo over its time budget spends it.
    import time

    from kerneltune._src.caching.persistent import PersistentCache
    from kerneltune._src.cli import demo_executors
    from kerneltune._src.cli.demo_measure import CPU_ROUNDS

    (case,) = [c for c in demo_cases.cases(on_gpu=False) if c.name == "softmax"]
    recorder = demo.Recorder()
    executors = {
        "kt_untuned": demo_executors.untuned(interpret=True),
        "kt_chosen": demo_executors.chosen(
            PersistentCache(str(tmp_path)), recorder, interpret=True
        ),
    }
    fns = demo.implementations_of(case, None, "left out (--no-tokamax)", executors)
    start = time.perf_counter()
    row, _, _, phases = demo.measure_row(case, fns, CPU_ROUNDS, recorder, rotate=False)
    wall = time.perf_counter() - start
    assert list(phases) == ["inputs", "first calls", "timing"]
    assert all(s >= 0 for s in phases.values()) and sum(phases.values()) <= wall
    assert phases["first calls"] > 0 and row.results["kt_chosen"].status == "ok"


def test_the_rows_input_programs_are_compiled_before_the_rows_and_draw_the_same_inputs(
    monkeypatch,
):
    # Compiled together up front (one by one they were 9 s of the GPU demo): each makes
    # the arrays the row's own program makes from the same seed, and a row whose
    # program does not build is left to measure_row, which reports it.
    cases = [c for c in demo_cases.cases(on_gpu=False) if c.name in ("softmax", "matmul")]
    broken = dataclasses.replace(cases[0], name="broken", args=lambda seed: 1 / 0)
    made = demo.input_programs([*cases, broken])
    assert sorted(made) == ["matmul", "softmax"]
    for case in cases:
        for seed in (0, 1):
            ours = jax.tree_util.tree_leaves(made[case.name](seed))
            theirs = jax.tree_util.tree_leaves(jax.jit(case.args)(seed))
            assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert not np.array_equal(
        jax.tree_util.tree_leaves(made["softmax"](0))[0],
        jax.tree_util.tree_leaves(made["softmax"](1))[0],
    )


def test_a_key_whose_budget_timed_nothing_is_not_counted_as_tuned():
    # Under load, a key granted little of the first-call process budget timed nothing
    # (report.best None; nothing stored) and then took its predicted config; the demo
    # counted it as tuned, and its read-back (the next run) found one key fewer in the
    # persistent cache than it said it had tuned (the newest-JAX suite, 2026-12-07).
    key = dict(device="cpu|cpu", op_id="softmax@v1", call_key="k1")
    other = dict(device="cpu|cpu", op_id="softmax@v1", call_key="k2")
    events = [
        ("autotune_finish", dict(key, report=types.SimpleNamespace(best=None, budgeted=True))),
        ("predicted", dict(key, cfg=None)),
        ("autotune_finish", dict(other, report=types.SimpleNamespace(best=1, budgeted=True))),
    ]
    where, _, tuned = demo.chosen_from(events)
    assert tuned == [("cpu|cpu", "softmax@v1", "k2")]
    assert where == "predicted 1, budget-tuned 1"
