"""Several families of keys tuned at once; the calls of one family in turn."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from kerneltune._src import concurrent_keys
from kerneltune._src.call_shapes import CallShape


def rec(name, family):
    return SimpleNamespace(op_id_v="op@v0", call_key=name, shape=CallShape(family, (1,)), name=name)


def test_families_run_at_once_and_the_calls_of_one_family_in_turn():
    records = [rec("a1", "A"), rec("b1", "B"), rec("a2", "A"), rec("b2", "B")]
    both_started = threading.Barrier(2, timeout=30)  # a1 and b1 must run at the same time
    running = {"A": 0, "B": 0}
    most = {"A": 0, "B": 0}
    lock = threading.Lock()

    def tune_one(r):
        family = r.shape.family
        with lock:
            running[family] += 1
            most[family] = max(most[family], running[family])
        if r.name.endswith("1"):
            both_started.wait()
        with lock:
            running[family] -= 1
        return r.name.upper()

    landed = []
    out = concurrent_keys.tune_families_at_once(
        records, tune_one, 3, lambda r, o: landed.append(o), lambda r, e: "failed"
    )
    assert out == ["A1", "B1", "A2", "B2"]  # the records' order
    assert sorted(landed) == sorted(out)
    assert most == {"A": 1, "B": 1}  # never two calls of one family at once


def test_a_failure_fails_the_rest_of_its_family_and_is_raised_after_the_others():
    records = [rec("a1", "A"), rec("a2", "A"), rec("b1", "B")]

    def tune_one(r):
        if r.name == "a1":
            raise KeyboardInterrupt
        return r.name

    landed = {}
    with pytest.raises(KeyboardInterrupt):
        concurrent_keys.tune_families_at_once(
            records, tune_one, 2, lambda r, o: landed.update({r.name: o}), lambda r, e: "failed"
        )
    assert landed == {"a1": "failed", "a2": "failed", "b1": "b1"}
