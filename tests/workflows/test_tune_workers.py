"""`kerneltune tune --workers N`: one process each, joined as one JAX job (seeds tuned
together, the other keys dealt by cost), results merged."""

import os
import subprocess
import sys
from types import SimpleNamespace

import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune._src.caching import manifest as manifests
from kerneltune._src.kernel import recording
from kerneltune._src.workflows.tune_workers import deal_by_cost, read_keys, visible_gpus, write_keys
from tests.helpers import ROOT, TESTS
from tests.offline_kernels import CHEAPEST, LoopCfg
from tests.worker_kernels import COST_TIMER, DIE, DyingKernel, SteadyKernel

TYPES = {"aaa_steady": LoopCfg, "zzz_dying": LoopCfg}


def record_manifest(path, calls):
    recording.clear_invocations()
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
    )
    ex = kt.Executor(chain)
    with recording.record_calls():
        for kernel, n in calls:
            ex(kernel, jnp.ones((n, n)))
    count = manifests.save_manifest(path)
    keys = {(r.op_id_v, r.call_key) for r in recording.iter_records(recording.all_invocations())}
    recording.clear_invocations()
    assert count == len(calls)
    return keys


def tune(*argv, env=None):
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(TESTS), full_env.get("PYTHONPATH", "")]
    )
    if "CUDA_VISIBLE_DEVICES" not in (env or {}):
        full_env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU: workers are plain processes
    return subprocess.run(
        [sys.executable, "-m", "kerneltune", *argv],
        env=full_env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_deal_puts_the_most_expensive_first_on_the_least_loaded_worker():
    def rec(key, n):
        return SimpleNamespace(op_id_v="op@v0", call_key=key, args=(SimpleNamespace(shape=(n,)),))

    records = [rec("a", 10), rec("b", 7), rec("c", 5), rec("d", 4), rec("e", 1)]
    parts = deal_by_cost(records, 2)
    assert [[r.call_key for r in p] for p in parts] == [["a", "d"], ["b", "c", "e"]]
    assert deal_by_cost(list(reversed(records)), 2) == parts  # order-independent
    with pytest.raises(ValueError, match="at least 1"):
        deal_by_cost(records, 0)


def test_visible_gpus_follow_cuda_visible_devices():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 1"}) == ["3", "1"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_key_files_round_trip_and_reject_other_documents(tmp_path):
    path = str(tmp_path / "keys.json")
    write_keys(path, [SimpleNamespace(op_id_v="op@v0", call_key="k1")])
    assert read_keys(path) == {("op@v0", "k1")}
    (tmp_path / "other.json").write_text('{"keys": [[1, 2]]}')
    with pytest.raises(ValueError, match="not a worker key file"):
        read_keys(str(tmp_path / "other.json"))


@pytest.mark.slow
def test_two_workers_give_the_same_entries_as_one(tmp_path):
    path = tmp_path / "manifest.json"
    keys = record_manifest(
        path,
        [(SteadyKernel(), 48), (SteadyKernel(), 40), (SteadyKernel(), 32), (SteadyKernel(), 24)],
    )
    results = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}.json"
        cache = tmp_path / f"cache{workers}"
        done = tune("--cache-dir", str(cache), "tune", str(path), "--workers", str(workers),
                    "--out", str(out), "--no-progress", "--import", "tests.worker_kernels",
                    env={COST_TIMER: "1"})  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        if workers == 2:
            assert "tuning in 2 worker processes" in done.stdout
            # One job: the family's costliest key (48²) tuned by both together, a
            # slice of its candidates each; the three others dealt (2 and 1).
            rows = [line.split() for line in done.stdout.splitlines()]
            table = [r[2:4] for r in rows if len(r) == 6 and r[0] in ("0", "1")]
            assert sorted(table) == [["1", "1"], ["1", "2"]], done.stdout
        results[workers] = kt.AutotuningResult.load(out, TYPES)
        # Every key landed in the shared persistent cache too.
        assert len(kt.PersistentCache(str(cache))) == len(keys)
    for result in results.values():
        assert {(e.op_id_v, e.call_key) for e in result} == keys
        # Every entry was tuned (not a heuristic stand-in), with every candidate timed.
        assert all(len(e.timings) == 3 for e in result)
    # The same winners: the cheapest candidate, by the deterministic cost timer.
    winners = [{(e.op_id_v, e.call_key): e.cfg for e in results[w]} for w in (1, 2)]
    assert winners[0] == winners[1] == dict.fromkeys(keys, CHEAPEST)


@pytest.mark.slow
def test_a_worker_that_dies_loses_only_its_unfinished_keys(tmp_path):
    path = tmp_path / "manifest.json"
    # The steady family's costliest key (48²) is tuned by both workers together; the
    # rest is dealt by cost: 40² to worker 0, the dying 32² to worker 1.
    keys = record_manifest(path, [(SteadyKernel(), 48), (SteadyKernel(), 40), (DyingKernel(), 32)])
    out = tmp_path / "out.json"
    done = tune("--cache-dir", str(tmp_path / "cache"), "tune", str(path), "--workers", "2",
                "--out", str(out), "--no-progress", "--import", "tests.worker_kernels",
                env={DIE: "1"})  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "worker 1 exited with 3" in done.stdout
    # Worker 0 finished its keys, then could only wait for the dead one: stopped.
    assert "worker 0 stopped: its keys were done" in done.stdout
    assert "worker 1: no config for zzz_dying" in done.stdout
    assert "2 of 3 calls have a config" in done.stdout
    result = kt.AutotuningResult.load(out, TYPES)
    tuned = {(e.op_id_v, e.call_key) for e in result}
    assert len(tuned) == 2 and tuned < keys
    assert all(op.startswith("aaa_steady") for op, _ in tuned)


def test_more_workers_than_gpus_are_capped_at_one_per_gpu(tmp_path):
    # On an H100, `--workers 2` put two processes on the one GPU: the second failed for
    # want of memory and lost its keys.
    path = tmp_path / "manifest.json"
    keys = record_manifest(path, [(SteadyKernel(), 32), (SteadyKernel(), 24)])
    out = tmp_path / "out.json"
    done = tune("--cache-dir", str(tmp_path / "cache"), "tune", str(path), "--workers", "2",
                "--out", str(out), "--no-progress", "--import", "tests.worker_kernels",
                env={"CUDA_VISIBLE_DEVICES": "0", "JAX_PLATFORMS": "cpu"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "only 1 visible GPU(s)" in done.stdout and "tuning in 1 worker(s)" in done.stdout
    assert "worker processes" not in done.stdout  # tuned here, not in 2 workers
    assert {(e.op_id_v, e.call_key) for e in kt.AutotuningResult.load(out, TYPES)} == keys


def test_a_stopped_worker_that_ignores_sigterm_is_killed_after_a_short_grace(tmp_path, monkeypatch):
    # A worker of a JAX job does not exit on SIGTERM (`jax.distributed` takes it as a
    # preemption notice): the parent waited 30 s for each one it stopped after a
    # sibling died. Its keys are in its result file (written atomically): a kill loses
    # nothing, so the grace is short.
    import time

    from kerneltune._src.workflows import tune_workers as tw

    ignores = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(120)"
    )
    done_keys = {("op@v1", "k0")}
    plan = SimpleNamespace(seeds=(), share=(SimpleNamespace(key=("op@v1", "k0")),))
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", ignores], stdout=subprocess.PIPE, text=True)
    assert alive.stdout.readline().strip() == "ready"  # SIGTERM is ignored from here
    monkeypatch.setattr(tw, "load_result", lambda path: path)
    monkeypatch.setattr(tw, "_keys", lambda result: done_keys if result == "full" else set())
    workers = [
        tw._Worker(0, None, plan, "full", "", None, alive),
        tw._Worker(1, None, SimpleNamespace(seeds=(), share=()), "none", "", None, dead),
    ]
    start = time.perf_counter()
    try:
        tw._wait(workers, poll_s=0.05)
    finally:
        alive.kill()
        alive.stdout.close()
    assert workers[0].stopped and alive.returncode is not None
    assert time.perf_counter() - start < 15  # 30 s and more before
