"""Shared tuning, with simulated processes (threads sharing an in-memory key-value
store, as in test_distributed.py): each process times a slice of one key's candidates
and all adopt the fastest of all."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from kerneltune._src.tuning import shared
from tests.tuning.test_distributed import A, B, C, new_key, report, run_as_processes


def _slices(n, candidates, keep):
    def body(peers):
        with shared.tuning_shared():
            return shared.shared_slice(candidates, keep=keep)

    return run_as_processes(n, lambda peers: _as_process(peers, body))


_process = threading.local()


def _as_process(peers, body):
    _process.peers = peers
    return body(peers)


@pytest.fixture
def simulated_peers(monkeypatch):
    monkeypatch.setattr(shared, "current_peers", lambda: getattr(_process, "peers", None))


def test_a_shared_slice_keeps_the_heuristic_and_hints_everywhere_and_deals_the_rest(
    simulated_peers,
):
    cands = list("habcdefg")
    got = _slices(3, cands, keep=["h", "e"])
    assert got == [list("hade"), list("hbef"), list("hceg")]
    # Together: every candidate, the kept ones in every slice, the rest in one.
    assert sorted(c for s in got for c in s if c not in "he") == list("abcdfg")
    # Outside `tuning_shared`, or alone, a process times every candidate.
    assert run_as_processes(2, lambda p: _as_process(p, lambda _: shared.shared_slice(cands))) == [
        cands,
        cands,
    ]


def test_shared_processes_adopt_the_fastest_of_all_slices_with_every_time(simulated_peers):
    key = new_key()
    # Process 0 timed A (the heuristic) and B; process 1 A and C.
    mine = {
        0: report([3e-3, 2e-3, None], statuses=["ok", "ok", "pruned"]),
        1: report([5e-3, None, 1e-3], statuses=["ok", "pruned", "ok"]),
    }

    def body(peers):
        r = mine[peers.process_id]
        sliced = dataclasses.replace(r, candidates=tuple(c for c in r.candidates if c.ok))
        with shared.tuning_shared() as joined:
            got = shared.agree(key, sliced, [A, B, C])
        return got, joined

    got = run_as_processes(2, lambda p: _as_process(p, body))
    for pid, (r, joined) in enumerate(got):
        assert r.best == C  # 1 ms, timed on process 1 only
        assert [c.cfg for c in r.candidates] == [A, B, C]
        assert [c.time_s for c in r.candidates] == [mine[pid].candidates[0].time_s, 2e-3, 1e-3]
        assert r.strategy.endswith("shared by 2 processes")
        assert joined == {key[1:]}


def test_a_candidate_that_failed_on_its_process_is_a_failure_everywhere(simulated_peers):
    key = new_key()
    mine = {
        0: report([3e-3, None, None], statuses=["ok", "run_error", "pruned"]),
        1: report([3e-3, None, 4e-3], statuses=["ok", "pruned", "ok"]),
    }

    def body(peers):
        with shared.tuning_shared():
            return shared.agree(key, mine[peers.process_id], [A, B, C])

    got = run_as_processes(2, lambda p: _as_process(p, body))
    for r in got:
        assert r.best == A
        assert r.candidates[1].status == "run_error"


def test_a_process_holding_the_key_cached_joins_without_results(simulated_peers):
    key = new_key()

    def body(peers):
        with shared.tuning_shared():
            if peers.process_id == 1:
                shared.join_cached(*key[1:], timeout_s=10)
                return None
            return shared.agree(key, report([3e-3, 1e-3, 2e-3]), [A, B, C], timeout_s=10)

    got = run_as_processes(2, lambda p: _as_process(p, body))
    assert got[0].best == B and got[1] is None
