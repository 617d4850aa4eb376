"""Exits while kerneltune work is in flight never abort the process (issue 12.1): a
compile abandoned at its timeout, a search strategy that raises, Ctrl-C in the CLI."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent(
    """
    import dataclasses, sys
    import jax.numpy as jnp
    import kerneltune as kt

    @dataclasses.dataclass(frozen=True)
    class C:
        reps: int

    class SlowToCompile(kt.Kernel):
        op_id = "slow_to_compile"

        def run(self, x, *, cfg):
            ys = [x]
            for i in range(cfg.reps):  # a long chain: XLA takes seconds to compile it
                ys.append(jnp.sin(ys[-1] @ x) + ys[max(0, i - 7)])
            return ys[-1]

        def heuristic_cfg(self, inv):
            return C(1)

        def candidate_cfgs(self, inv):
            return [C(1), C(2500)]

    class Raises:
        name = "raises"

        def search(self, bench):
            bench.submit([1])  # starts the slow compile...
            raise RuntimeError("the strategy failed")  # ...and leaves it running

    strategy = Raises() if sys.argv[1] == "raise" else "exhaustive"
    tuner = kt.Tuner(compile_timeout_s=0.5, progress=False, strategy=strategy)
    ex = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache(), tuner=tuner))
    print(ex.choose_config(SlowToCompile(), jnp.ones((16, 16))), flush=True)
    """
)


def run_script(tmp_path, mode):
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    env = dict(os.environ, KERNELTUNE_CACHE_DIR="off", JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, str(path), mode], capture_output=True, text=True, env=env, timeout=240
    )


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_exit_after_a_compile_timeout_waits_for_the_abandoned_compile(tmp_path, attempt):
    # Before: SIGABRT (exit -6) in most runs, as the interpreter finalised under a
    # compile thread still inside XLA.
    proc = run_script(tmp_path, "timeout")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "C(reps=1)" in proc.stdout
    assert "terminate called" not in proc.stderr


def test_a_search_strategy_that_raises_is_a_normal_error(tmp_path):
    proc = run_script(tmp_path, "raise")
    assert "terminate called" not in proc.stderr and proc.returncode >= 0
    # The chain reports the failed tuning and falls back to the heuristic.
    assert proc.returncode == 1 and "RuntimeError: the strategy failed" in proc.stderr


def test_ctrl_c_in_tune_exits_130_and_keeps_what_finished(tmp_path):
    import kerneltune as kt
    from tests.helpers import ROOT, TESTS
    from tests.offline_kernels import LoopCfg
    from tests.worker_kernels import SLEEP, SleepyKernel, SteadyKernel
    from tests.workflows.test_tune_workers import record_manifest

    manifest, out = tmp_path / "calls.json", tmp_path / "result.json"
    record_manifest(manifest, [(SteadyKernel(), 64), (SleepyKernel(), 64)])
    # Building a sleepy candidate takes 60 s: the run cannot end before the Ctrl-C,
    # however loaded the machine.
    env = dict(os.environ, **{SLEEP: "60"}, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerneltune", "--cache-dir", str(tmp_path / "cache"), "tune",
         str(manifest), "--out", str(out), "--no-progress", "--import", "tests.worker_kernels"],
        env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A job started in the background (CI, nohup) inherits an ignored SIGINT, and
        # Python then never raises KeyboardInterrupt: give the child the default back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)  # the first key is done: the sleepy one is building now
    assert out.exists(), proc.communicate()
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    # Exit waits for the candidate still building, and says so; a second Ctrl-C
    # exits at once.
    stderr = ""
    while "Ctrl-C exits now" not in stderr and proc.poll() is None:
        stderr += proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    rest_out, rest_err = proc.communicate(timeout=120)
    stderr += rest_err
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and "terminate called" not in stderr
    saved = kt.AutotuningResult.load(out, {"aaa_steady": LoopCfg, "zzz_sleepy": LoopCfg})
    assert [e.op_id_v for e in saved] == ["aaa_steady@v0"]


# --- abandoned work frees what it holds inside its stage ---------------------------
# Exit waits only for counted stages: a daemon thread that drops the last reference to
# XLA objects (a lowering, device arrays) after its stage ended frees them while the
# interpreter finalises, which aborts the process (the SIGABRT above, on JAX 0.12).


class _Payload:
    """Stands in for what a job holds (its inputs, its lowering)."""


@pytest.fixture
def alive_at_stage_end(monkeypatch):
    """Calls `watch(obj)`; returns, for each stage that ended on another thread, whether
    the watched object was still alive at that moment."""
    import threading
    import weakref

    from kerneltune._src.tuning import stages

    refs, seen = [], []
    finished = stages._stage_finished
    before = set(threading.enumerate())  # threads other tests left running

    def finished_and_checked():
        if threading.current_thread() not in before:
            seen.append(any(r() is not None for r in refs))
        finished()

    monkeypatch.setattr(stages, "_stage_finished", finished_and_checked)
    return (lambda obj: refs.append(weakref.ref(obj))), seen


def _held_until(release, payload):
    def job():
        release.wait(30)
        return payload is not None

    return job


def test_an_abandoned_compile_job_is_freed_inside_its_stage(alive_at_stage_end):
    import threading

    from kerneltune._src.tuning import stages
    from kerneltune._src.tuning.compiling import CompilePool

    watch, seen = alive_at_stage_end
    release, payload = threading.Event(), _Payload()
    watch(payload)
    pool = CompilePool(1, timeout_s=0.05, stall_s=None)
    pool.submit("k", _held_until(release, payload))
    del payload
    outcomes = []
    while not outcomes:
        outcomes = pool.poll(0.05)
    assert [o.timed_out for o in outcomes] == [True]
    release.set()
    stages.wait_for_running_stages()
    pool.close()
    assert seen == [False]


def _raising_after(release, payload):
    def job():
        release.wait(30)
        raise RuntimeError(f"failed holding {payload!r}")

    return job


def _started_then_held(started, release, payload):
    def job():  # returns what it holds, as a compile returns its executable
        started.set()
        release.wait(30)
        return payload

    return job


@pytest.mark.parametrize("how", ["abandoned", "closed"])
def test_a_failed_or_unpolled_compile_job_is_freed_inside_its_stage(alive_at_stage_end, how):
    # Before: an error's traceback held the worker's frame and so the job, in a cycle
    # that only a collection frees (on any thread, at any time); and a job finishing
    # after `close()` went to the result queue, freed with the pool later.
    import gc
    import threading

    from kerneltune._src.tuning import stages
    from kerneltune._src.tuning.compiling import CompilePool

    watch, seen = alive_at_stage_end
    release, started, payload = threading.Event(), threading.Event(), _Payload()
    watch(payload)
    pool = CompilePool(1, timeout_s=0.05 if how == "abandoned" else None, stall_s=None)
    if how == "abandoned":
        job = _raising_after(release, payload)
    else:
        job = _started_then_held(started, release, payload)
    pool.submit("k", job)
    del payload, job
    if how == "abandoned":
        outcomes = []
        while not outcomes:
            outcomes = pool.poll(0.05)
        assert [o.timed_out for o in outcomes] == [True]
    else:
        assert started.wait(30)  # running: close() cannot simply drop it from the queue
        pool.close()
    gc.disable()  # only reference counts may free it: deterministic
    try:
        release.set()
        stages.wait_for_running_stages()
    finally:
        gc.enable()
    assert seen == [False]


def test_an_abandoned_first_run_is_freed_inside_its_stage(alive_at_stage_end):
    import threading

    from kerneltune._src.tuning import run_bound, stages

    watch, seen = alive_at_stage_end
    release, payload = threading.Event(), _Payload()
    watch(payload)
    out, times = run_bound.warm_up(_held_until(release, payload), [[]], 1, bound_s=0.05)
    assert out is run_bound.ABANDONED and times == []
    del payload
    release.set()
    stages.wait_for_running_stages()
    assert seen == [False]


def test_a_background_check_frees_its_arguments_inside_its_stage(alive_at_stage_end):
    import threading

    from kerneltune._src.tuning import programs, stages

    watch, seen = alive_at_stage_end
    release, payload = threading.Event(), _Payload()
    watch(payload)
    check = programs.Background(lambda p: release.wait(30) and p is not None, payload)
    del payload
    release.set()
    stages.wait_for_running_stages()
    assert check.result() is True
    assert seen == [False]
