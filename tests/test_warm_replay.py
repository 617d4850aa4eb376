"""Warm start, replayed over the exhaustive timings recorded on an H100 (the shipped
table): each shape held out in turn starts from the other shapes' winners."""

from __future__ import annotations

import statistics

import pytest

from benchmarks import warm_replay

ENTRIES = warm_replay.load(warm_replay.DEFAULT_TABLE)


def medians(outcomes, method):
    by_op = {}
    for o in outcomes:
        if o.method == method:
            by_op.setdefault(o.op, []).append(o)
    return {
        op: (statistics.median(o.regret for o in g), statistics.median(o.evaluated for o in g))
        for op, g in by_op.items()
    }


@pytest.mark.parametrize(
    ("backend", "ops"),
    [
        (None, {"attention@v1", "layer_norm@v1", "matmul@v3", "rms_norm@v1"}),
        ("triton", {"matmul@v3"}),  # the Pallas matmul alone: no cuBLAS that wins everywhere
        ("pallas", {"attention@v1"}),
    ],
)
def test_warm_start_is_within_2_percent_of_the_best_with_a_quarter_of_the_evaluations(backend, ops):
    outcomes = warm_replay.replay(ENTRIES, backend=backend, seeds=range(4))
    warm = medians(outcomes, "warm start")
    cold = medians(outcomes, "cold budgeted")
    assert ops <= set(warm)
    for op in ops:
        regret, evaluated = warm[op]
        assert regret <= 0.02, (op, backend, regret)
        assert evaluated <= 0.25, (op, backend, evaluated)
        assert evaluated < cold[op][1]  # fewer than the search that starts cold


def test_the_replay_measures_regret_against_the_recorded_best():
    (entry,) = [e for e in ENTRIES if e.op_id_v == "matmul@v3"][:1]
    cfgs, times = warm_replay.space_of(entry, None)
    ev = warm_replay.ReplayEvaluator(cfgs, times, 0, noise=0.0, seed=0)
    ev.evaluate(range(len(cfgs)))
    assert times[ev.pick()] == min(t for t in times if t is not None)
