"""Multi-process agreement, with simulated processes: threads of this process sharing an
in-memory stand-in for JAX's key-value store. The real thing (several processes joined
by `jax.distributed.initialize`) is in test_distributed_multiprocess.py."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import kerneltune as kt
from kerneltune._src.core import devices
from kerneltune._src.tuning import distributed
from kerneltune._src.tuning.distributed import (
    AgreementError,
    AgreementTimeoutError,
    Peers,
    agree,
    combine,
    payload,
)
from kerneltune._src.tuning.report import CandidateResult, TuningReport
from kerneltune._src.workflows.verify import verify_agreement

DEV = "cpu|cpu"
_ops = itertools.count()


class FakeKV:
    """The parts of JAX's DistributedRuntimeClient that agreement uses, in memory,
    raising errors worded like the real client's."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.cv = threading.Condition()

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        with self.cv:
            if key in self.data and not allow_overwrite:
                raise RuntimeError(f"ALREADY_EXISTS: key {key} already exists.")
            self.data[key] = value
            self.cv.notify_all()

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.data, timeout_in_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
            return self.data[key]

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        with self.cv:
            return [(k, v) for k, v in self.data.items() if k.startswith(prefix)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cfg:
    block: int


A, B, C = Cfg(block=16), Cfg(block=32), Cfg(block=64)


def report(times, *, statuses=None, cfgs=(A, B, C), name="op"):
    """A tuning report with one time (or None) per candidate; status "ok" when timed."""
    statuses = statuses or ["ok" if t is not None else "run_error" for t in times]
    results = tuple(
        CandidateResult(
            cfg=c, status=s, time_s=t if s == "ok" else None, error=None if s == "ok" else "boom"
        )
        for c, t, s in zip(cfgs, times, statuses, strict=True)
    )
    ok = [i for i, r in enumerate(results) if r.ok]
    best = cfgs[min(ok, key=lambda i: results[i].time_s)] if ok else None
    return TuningReport(best=best, candidates=results, timer="wallclock", name=name)


def payloads(*reports):
    return {
        pid: payload(r, op_id_v="op@v0", device=DEV, process_id=pid)
        for pid, r in enumerate(reports)
    }


def new_key():
    return (DEV, f"op{next(_ops)}@v0", "k" * 32)


def run_as_processes(n, fn, client=None):
    """Runs `fn(peers)` for process ids 0..n-1 on threads; returns results or exceptions."""
    client = client or FakeKV()

    def one(pid):
        try:
            return fn(Peers(client=client, process_id=pid, num_processes=n))
        except Exception as e:  # collected and checked by the test
            return e

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


# -- the decision rule ---------------------------------------------------------------


def test_combined_median_beats_every_local_winner():
    # Alone, process 0 picks B and process 1 picks A; over both, C is the best bet.
    got = combine(payloads(report([25e-3, 1e-3, 4e-3]), report([1e-3, 25e-3, 4e-3])), [A, B, C])
    assert got.winner == 2
    assert got.local_winners == {0: 1, 1: 0}
    assert got.combined_s == pytest.approx((13e-3, 13e-3, 4e-3))
    assert got.coverage == (2, 2, 2)


def test_median_ignores_one_noisy_process():
    reps = [report([1e-3, 2e-3, 3e-3])] * 3 + [report([90e-3, 2e-3, 3e-3])]
    assert combine(payloads(*reps), [A, B, C]).winner == 0


def test_a_candidate_failing_on_one_process_never_wins():
    got = combine(payloads(report([1e-3, 5e-3, 6e-3]), report([None, 5e-3, 6e-3])), [A, B, C])
    assert got.winner == 1
    assert got.excluded == {0: "run_error on process 1"}


def test_candidates_measured_by_every_process_come_first():
    # A search strategy skipped ("pruned") B on process 1: it did not fail, but a time
    # measured on one process only does not beat one measured on both.
    r0 = report([3e-3, 1e-3, 9e-3])
    r1 = report([3e-3, None, 9e-3], statuses=["ok", "pruned", "ok"])
    got = combine(payloads(r0, r1), [A, B, C])
    assert got.winner == 0
    assert got.coverage == (2, 1, 2)
    assert 1 not in got.excluded


def test_ties_within_the_noise_band_go_to_the_earliest_candidate_in_every_process():
    # As one process decides (`winner.fastest`): the chain lists the heuristic first,
    # and only a candidate measurably faster replaces it. Before: the lowest median
    # won outright, so a 1% difference (noise) replaced the heuristic in a job of
    # several processes but not in one.
    got = combine(payloads(report([2e-3, 2e-3, 3e-3]), report([2e-3, 2e-3, 3e-3])), [B, A, C])
    assert got.winner == 0
    near = combine(
        payloads(report([2e-3, 1.98e-3, 3e-3]), report([2e-3, 1.98e-3, 3e-3])), [B, A, C]
    )
    assert near.winner == 0
    far = combine(payloads(report([2e-3, 1.5e-3, 3e-3]), report([2e-3, 1.5e-3, 3e-3])), [B, A, C])
    assert far.winner == 1


def test_no_winner_when_every_candidate_failed_somewhere():
    got = combine(payloads(report([1e-3, None, None]), report([None, 1e-3, None])), [A, B, C])
    assert got.winner is None
    assert set(got.excluded) == {0, 1, 2}


def test_different_candidate_lists_are_an_error():
    p = payloads(report([1e-3, 2e-3, 3e-3]), report([1e-3, 2e-3], cfgs=(A, B)))
    with pytest.raises(AgreementError, match="different candidate lists"):
        combine(p, [A, B, C])


# -- agreeing through the key-value store --------------------------------------------


def test_one_process_returns_the_report_unchanged():
    r = report([1e-3, 2e-3, 3e-3])
    assert agree(new_key(), r) is r


def test_simulated_processes_all_end_with_the_same_config():
    key = new_key()
    # Alone, processes 0 and 2 pick B, 1 and 3 pick A; the medians over processes are
    # A 3 ms, B 3 ms, C 2 ms.
    local = [[5e-3, 1e-3, 2e-3], [1e-3, 5e-3, 2e-3], [5e-3, 1e-3, 3e-3], [1e-3, 5e-3, 2e-3]]
    got = run_as_processes(
        4, lambda peers: agree(key, report(local[peers.process_id]), peers=peers)
    )
    assert [r.best for r in got] == [C, C, C, C]
    assert [r.candidates[0].time_s for r in got] == [t[0] for t in local]  # own timings kept


def test_the_same_key_can_be_agreed_on_again():
    key = new_key()
    first = run_as_processes(2, lambda p: agree(key, report([1e-3, 2e-3, 3e-3]), peers=p))
    client = FakeKV()  # a second round must not read the first round's values
    times = {0: [3e-3, 2e-3, 1e-3], 1: [3e-3, 2e-3, 1e-3]}
    again = run_as_processes(2, lambda p: agree(key, report(times[p.process_id]), peers=p), client)
    assert [r.best for r in first] == [A, A]
    assert [r.best for r in again] == [C, C]


def test_a_process_that_never_arrives_makes_the_others_time_out():
    key = new_key()
    client = FakeKV()

    def body(peers):
        if peers.process_id == 2:
            return "never called"
        start = time.monotonic()
        try:
            agree(key, report([1e-3, 2e-3, 3e-3], name="op(f32[8])"), peers=peers, timeout_s=0.5)
        except AgreementTimeoutError as e:
            return e, time.monotonic() - start
        return None

    got = run_as_processes(3, body, client)
    for err, waited in got[:2]:
        assert isinstance(err, TimeoutError)
        assert err.missing == (2,)
        assert "process(es) 2 of 3" in str(err) and "op(f32[8])" in str(err)
        assert "KERNELTUNE_AGREE_TIMEOUT" in str(err)
        assert waited < 5


def test_a_retry_after_a_timeout_rejoins_the_same_round():
    key = new_key()
    client = FakeKV()
    p0 = Peers(client=client, process_id=0, num_processes=2)
    p1 = Peers(client=client, process_id=1, num_processes=2)
    with pytest.raises(AgreementTimeoutError):
        agree(key, report([1e-3, 9e-3, 9e-3]), peers=p0, timeout_s=0.2)
    # Process 1 arrives late and decides from process 0's published times: A wins
    # (A 1.5 ms, B 9 ms, C 5 ms).
    late = agree(key, report([2e-3, 9e-3, 1e-3]), peers=p1, timeout_s=5)
    # Process 0 retries with new times (with them C would win); it must decide from
    # what process 1 saw.
    retried = agree(key, report([9e-3, 1e-3, 9e-3]), peers=p0, timeout_s=5)
    assert late.best == retried.best == A


def test_the_timeout_comes_from_the_option(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_AGREE_TIMEOUT", "0.3")
    peers = Peers(client=FakeKV(), process_id=0, num_processes=2)
    start = time.monotonic()
    with pytest.raises(AgreementTimeoutError) as info:
        agree(new_key(), report([1e-3, 2e-3, 3e-3]), peers=peers)
    assert info.value.timeout_s == 0.3 and time.monotonic() - start < 5


def test_a_broken_coordination_service_is_reported_with_the_op():
    class Broken(FakeKV):
        def blocking_key_value_get(self, key, timeout_in_ms):
            raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")

    peers = Peers(client=Broken(), process_id=0, num_processes=2)
    with pytest.raises(AgreementError, match=r"lost contact.*UNAVAILABLE"):
        agree(new_key(), report([1e-3, 2e-3, 3e-3], name="myop(f32[4])"), peers=peers, timeout_s=1)


def test_processes_with_different_candidates_all_raise():
    key = new_key()

    def body(peers):
        cfgs = (A, B, C) if peers.process_id == 0 else (A, B)
        return agree(key, report([1e-3] * len(cfgs), cfgs=cfgs), peers=peers, timeout_s=5)

    got = run_as_processes(2, body)
    assert all(isinstance(e, AgreementError) for e in got)


# -- the selection chain uses the agreed winner --------------------------------------


class ScriptedTuner:
    """A tuner that 'measures' the times given for the calling simulated process."""

    def __init__(self, times_by_process):
        self.times = times_by_process
        self.local = threading.local()

    def tune(
        self, make_fn, args, kwargs, candidates, *, reference_cfg=None, backward=False, name=""
    ):
        return report(self.times[self.local.pid], cfgs=tuple(candidates), name=name)


class ThreeWay(kt.Kernel):
    op_id = "three-way"

    def run(self, x, *, cfg):
        return x * cfg.block

    def heuristic_cfg(self, inv):
        return A

    def candidate_cfgs(self, inv):
        return [A, B, C]


def test_the_chain_caches_and_persists_the_agreed_config(monkeypatch, tmp_path):
    import jax.numpy as jnp

    from kerneltune._src.caching.persistent import PersistentCache

    client = FakeKV()
    tuner = ScriptedTuner({0: [9e-3, 1e-3, 4e-3], 1: [1e-3, 9e-3, 4e-3]})
    local_peers = threading.local()
    monkeypatch.setattr(distributed, "current_peers", lambda: local_peers.peers)

    def body(peers):
        local_peers.peers = peers
        tuner.local.pid = peers.process_id
        pc = PersistentCache(tmp_path / f"p{peers.process_id}")
        chain = kt.ConfigSelectorChain(kt.ConfigCache(), tuner=tuner, persistent=pc)
        cfg = kt.Executor(chain).choose_config(ThreeWay(), jnp.ones((4, 4)))
        (key,) = chain.cache.keys()
        return cfg, chain.cache.get(*key), pc.get(*key, cfg_type=Cfg)

    got = run_as_processes(2, body, client)
    assert got == [(C, C, C), (C, C, C)]


# -- verify_agreement ------------------------------------------------------------------


def test_verify_agreement_passes_when_every_process_holds_the_same_configs():
    dev = devices.device_fingerprint()
    held = {(dev, "op@v0", "k1"): A, (dev, "op@v0", "k2"): B, ("other|gpu", "op@v0", "k1"): C}
    got = run_as_processes(3, lambda p: verify_agreement(held, peers=p, timeout_s=5))
    assert all(check.ok and check.keys == 2 and not check.partial for check in got)
    assert len({check.digest for check in got}) == 1
    assert "all 3 processes agree on 2 configs" in got[0].summary()


def test_verify_agreement_names_the_keys_that_differ():
    dev = devices.device_fingerprint()

    def body(peers):
        held = {(dev, "op@v0", "k1"): A, (dev, "op@v0", "k2"): B if peers.process_id else C}
        if peers.process_id == 1:
            held[(dev, "eval@v0", "k3")] = A
        return verify_agreement(held, peers=peers, timeout_s=5, raise_on_mismatch=False)

    got = run_as_processes(2, body)
    check = got[0]
    assert not check.ok
    assert list(check.conflicts) == [("op@v0", "k2")]
    assert sorted(check.conflicts[("op@v0", "k2")].values()) == [(0,), (1,)]
    assert check.partial == {("eval@v0", "k3"): (1,)}
    assert "op@v0 (call key k2)" in check.summary()


def test_verify_agreement_raises_by_default_on_a_conflict():
    dev = devices.device_fingerprint()

    def body(peers):
        cache = kt.ConfigCache()
        cache.put(dev, "op@v0", "k", A if peers.process_id else B)
        return verify_agreement(cache, peers=peers, timeout_s=5)

    got = run_as_processes(2, body)
    assert all(isinstance(e, AgreementError) and "differ" in str(e) for e in got)


def test_verify_agreement_reads_executors_and_results():
    dev = devices.device_fingerprint()
    chain = kt.ConfigSelectorChain(kt.ConfigCache())
    chain.cache.put(dev, "op@v0", "k", A)
    assert verify_agreement(chain).keys == 1
    assert verify_agreement(kt.Executor(chain)).keys == 1
    with pytest.raises(TypeError, match="source must be"):
        verify_agreement(42)


def test_mixed_devices_and_timers_still_agree_with_a_warning(caplog):
    key = new_key()

    def body(peers):
        r = report([1e-3, 2e-3, 3e-3] if peers.process_id else [3e-3, 2e-3, 1e-3])
        if peers.process_id:
            r = dataclasses.replace(r, timer="cupti")
        dev_key = ("NVIDIA H200|cuda 13000" if peers.process_id else DEV, *key[1:])
        return agree(dev_key, r, peers=peers, timeout_s=5)

    with caplog.at_level("WARNING", logger="kerneltune"):
        got = run_as_processes(2, body)
    assert got[0].best == got[1].best
    text = caplog.text
    assert "different devices" in text and "different timers" in text


# -- the rule of a shared tuning -------------------------------------------------------


def test_without_coverage_a_candidate_timed_by_one_process_can_win():
    # A shared tuning: B timed only by process 0, C only by process 1, the heuristic A
    # by both. By coverage A would win (the only one timed twice); by time, B.
    r0 = report([3e-3, 1e-3, None], statuses=["ok", "ok", "pruned"])
    r1 = report([3e-3, None, 2e-3], statuses=["ok", "pruned", "ok"])
    assert combine(payloads(r0, r1), [A, B, C]).winner == 0
    assert combine(payloads(r0, r1), [A, B, C], by_coverage=False).winner == 1
