"""The demo's verdicts and summary line, its notes for what was not timed, and where
the chosen configs came from, on hand-made rows and events."""

from __future__ import annotations

import dataclasses

import pytest

from kerneltune._src.cli import demo, demo_results
from kerneltune._src.cli.demo_measure import Measured
from kerneltune._src.cli.demo_results import Row


def _row(label, plain, tokamax, chosen, untuned=1e-3):
    def m(t):
        if isinstance(t, str):
            return Measured(t, note="why" if t != "n/a" else "tokamax has no such op")
        return Measured("ok", time_s=t, first_call_s=1.0, peak_bytes=2**20)

    results = {"plain": m(plain), "tokamax": m(tokamax), "kt_untuned": m(untuned)}
    results["kt_chosen"] = m(chosen)
    return Row(label, label, "8x8", "fwd", "jnp", results)


@pytest.mark.parametrize(
    "plain, tokamax, chosen, verdict",
    [
        (2.0, 1.5, 1.0, ("faster", 1.5)),  # against the faster peer, tokamax
        (1.04, "n/a", 1.0, ("level", 1.04)),
        (1.0, 0.96, 1.0, ("level", 0.96)),
        (1.0, 0.94, 1.0, ("slower", 0.94)),
        (1.0, "failed", 1.0, ("level", 1.0)),  # a failed peer is no competitor
    ],
)
def test_the_verdict_is_against_the_faster_peer_with_a_5_percent_level(
    plain, tokamax, chosen, verdict
):
    word, ratio = _row("op", plain, tokamax, chosen).verdict()
    assert word == verdict[0] and ratio == pytest.approx(verdict[1])


def test_the_summary_groups_rows_and_names_what_was_not_timed():
    rows = [
        _row("ragged_dot", 19e-3, 6.6e-3, 3.5e-3),
        _row("attention", 7.8e-4, 8.5e-4, 7.8e-4),
        _row("softmax", 3.9e-4, "n/a", 4.5e-4),
        _row("matmul", 5.5e-5, "n/a", "failed"),
    ]
    line = demo_results.summary(rows)
    assert line.startswith("Summary: kerneltune as chosen, against the faster of plain JAX")
    assert (
        "faster on ragged_dot (1.89x); level on attention (1.00x); slower on softmax (0.87x)"
        in (line)
    )
    assert "not timed on matmul" in line
    assert line.endswith("First calls: kerneltune 3.0 s in all, plain JAX 4.0 s.")
    assert "\n" not in line
    assert demo_results.summary(rows, interpreter=True).startswith(
        "Summary (CPU: interpreter timings, meaningless for a GPU):"
    )


def test_notes_say_each_reason_once_with_its_rows():
    rows = [_row("a", 1.0, "n/a", 1.0), _row("b", 1.0, "n/a", 1.0), _row("c", 1.0, "oom", 1.0)]
    assert demo_results.notes(rows) == [
        "tokamax: n/a: tokamax has no such op (a, b)",
        "tokamax: oom: why (c)",
    ]


def test_the_tables_show_times_ratios_and_missing_cells():
    header, body = demo_results.timing_table([_row("softmax", 3.9e-4, "n/a", 2.6e-4)])
    assert header[-2:] == ["x plain", "x tokamax"]
    assert body == [["softmax", "8x8", "fwd", "390 us", "n/a", "1 ms", "260 us", "1.50x", "-"]]
    header, body = demo_results.first_call_table([_row("softmax", 3.9e-4, "n/a", 2.6e-4)])
    assert body[0][1:5] == ["1.00 s", "-", "1.00 s", "1.00 s"]
    assert body[0][5:9] == ["1.0 MiB", "-", "1.0 MiB", "1.0 MiB"]


@dataclasses.dataclass
class _Report:
    budgeted: bool


@dataclasses.dataclass(frozen=True)
class _Cfg:
    backend: str


def test_chosen_from_counts_sources_per_key_and_lists_the_tuned_keys():
    def ev(event, key, **data):
        return event, {"device": "dev", "op_id": "op@v1", "call_key": key, **data}

    events = [
        ev("autotune_start", "k1"),
        ev("autotune_finish", "k1", cfg=_Cfg("mosaic"), report=_Report(budgeted=True)),
        ev("cache_hit", "k1", cfg=_Cfg("mosaic"), level="memory"),  # the same key again
        ev("cache_hit", "k2", cfg=_Cfg("cudnn"), level="shipped"),
        ev("predicted", "k3", cfg=_Cfg("xla")),
        ev("cache_hit", "k4", cfg=_Cfg("xla"), level="shipped"),
    ]
    where, backends, tuned = demo.chosen_from(events)
    assert where == "shipped 2, budget-tuned 1, predicted 1"
    assert backends == "cudnn+mosaic+xla"
    assert tuned == [("dev", "op@v1", "k1")]
    assert demo.chosen_from([ev("heuristics", "k", cfg=object())])[:2] == ("heuristic", "")


def test_a_file_that_is_no_comparison_is_refused(tmp_path):
    (tmp_path / demo_results.FILE).write_text('{"kind": "kerneltune.cache_export"}')
    with pytest.raises(ValueError, match="not a kerneltune demo comparison"):
        demo_results.load(str(tmp_path))
    assert demo_results.load(str(tmp_path / "elsewhere")) is None


def test_columns_that_ran_one_program_are_named_with_their_rows():
    rows = [_row("attention", 1.0, 1.1, 1.0), _row("matmul", 1.0, "n/a", 1.0), _row("glu", 1, 1, 1)]
    for r in rows[:2]:
        r.results["kt_untuned"].program_of = "kt_chosen"
    assert demo_results.shared_programs(rows) == [
        "kt untuned lowered to the same program as kt chosen, which was compiled and timed "
        "once; kt untuned's first call is its own tracing plus that compile and first run "
        "(attention, matmul)."
    ]
    assert demo_results.shared_programs(rows[2:]) == []
