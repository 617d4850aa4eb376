"""Timers: the wall clock, CUPTI's result shapes, and falling back when CUPTI is unsafe."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import pytest

from kerneltune._src.tuning import stages, timing
from kerneltune._src.tuning.tuner import Tuner
from tests.helpers import CostInProgram, rand


@pytest.fixture
def fresh_profiler_state(monkeypatch):
    """Isolates the process-wide 'the profiler was used' and 'CUPTI broke' records."""
    monkeypatch.setattr(timing, "_profiler_seen", threading.Event())
    monkeypatch.setattr(timing, "_cupti_broken", [])
    for var in timing._CUPTI_INJECTION_VARIABLES:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def on_gpu(monkeypatch):
    """Pretends the default device is a CUDA GPU, so the timer choice can be tested."""
    monkeypatch.setattr(timing, "default_platform", lambda: "gpu")


def compiled_square():
    x = jnp.arange(4096.0)
    return jax.jit(lambda v: v * v).lower(x).compile(), x


def test_wallclock_timer_amortises_calls():
    fn, x = compiled_square()
    timer = timing.WallClockTimer()
    assert isinstance(timer, timing.Timer)
    one = timer.sample(fn, [[x]], 1, 0)
    many = timer.sample(fn, [[x], [x + 1]], 200, 0)
    assert one > 0 and many > 0
    assert many < one * 50  # per-call time, not the total of 200 calls (noise-proof margin)


def test_auto_uses_the_wall_clock_on_cpu():
    timer, note = timing.choose_timer("auto")
    assert timer.name == "wallclock" and note is None
    timer, note = timing.choose_timer("cupti")
    assert timer.name == "wallclock" and "CUDA GPU" in note
    custom = timing.WallClockTimer()
    assert timing.choose_timer(custom) == (custom, None)
    with pytest.raises(ValueError, match="timer"):
        timing.choose_timer("events")


def test_cupti_is_not_used_while_a_profiler_trace_is_active(tmp_path, fresh_profiler_state, on_gpu):
    assert timing.profiler_conflict() is None
    jax.profiler.start_trace(str(tmp_path))
    try:
        assert timing.profiler_conflict() == "a JAX profiler trace is active"
        timer, note = timing.choose_timer("auto")
        assert timer.name == "wallclock" and "trace is active" in note
        # The tuner still tunes, with the wall clock, and reports why.
        x = jnp.ones((64,), jnp.float32)
        report = Tuner(progress=False).tune(lambda k: lambda v: v * k, (x,), {}, [1.0, 2.0])
        assert report.best is not None and report.timer == "wallclock"
        assert "trace is active" in report.timer_note
    finally:
        jax.profiler.stop_trace()
    # Once stopped, JAX's own state forgets the trace; CUPTI is still unsafe.
    assert timing.profiler_conflict() == "the JAX profiler was used earlier in this process"


def test_profiler_used_through_the_context_manager_is_remembered(tmp_path, fresh_profiler_state):
    with jax.profiler.trace(str(tmp_path)):
        jnp.ones(3).block_until_ready()
    assert "used earlier" in timing.profiler_conflict()


def test_an_attached_cupti_tool_disables_cupti(monkeypatch, fresh_profiler_state, on_gpu):
    monkeypatch.setenv("CUDA_INJECTION64_PATH", "/opt/nsight/libinjection.so")
    timer, note = timing.choose_timer("auto")
    assert timer.name == "wallclock" and "CUDA_INJECTION64_PATH" in note


@pytest.mark.parametrize(
    "timings, expected",
    [
        (None, []),
        (1.5, [1.5]),
        ([1.0, 2.0], [1.0, 2.0]),
        ([("k1", 1.0), ("k2", 0.5)], [1.5]),
        ([[("k1", 1.0), ("k2", 0.5)], [("k1", 2.0), ("k2", 0.5)]], [1.5, 2.5]),
    ],
)
def test_cupti_results_of_every_shape_are_read(timings, expected):
    assert timing._timings_ms(timings) == expected


def fake_measure_api(monkeypatch, measure, takes_iterations=True):
    monkeypatch.setattr(timing, "_measure_api", lambda: (measure, takes_iterations, {}))


def test_cupti_timer_reads_device_time(monkeypatch):
    def measure(f, *, iterations=1):
        def run(*args):
            return f(*args), [2.0] * iterations  # 2 ms per call

        return run

    fake_measure_api(monkeypatch, measure)
    fn, x = compiled_square()
    assert timing.CuptiTimer().sample(fn, [[x]], 4, 0) == pytest.approx(2e-3)

    def measure_once(f):
        return lambda *args: (f(*args), 3.0)

    fake_measure_api(monkeypatch, measure_once, takes_iterations=False)
    assert timing.CuptiTimer().sample(fn, [[x]], 2, 0) == pytest.approx(3e-3)


def test_detaching_cupti_waits_for_another_tunings_session(monkeypatch):
    # CUPTI takes one subscriber: a timer's closing session overlapping another
    # tuning's sample failed ("Attempted to subscribe to CUPTI while another
    # subscriber ... is active") and sent that process to the wall clock for good.
    detached = threading.Event()

    def measure(f, *, iterations=1):
        def run(*args):
            detached.set()  # only the closing session runs through the plain API here
            return f(*args), [1.0] * iterations

        return run

    def attached(f, *, iterations=1):
        return lambda *args: (f(*args), [1.0] * iterations)

    fake_measure_api(monkeypatch, measure)
    monkeypatch.setattr(timing, "_attached_session", lambda: attached)
    timer = timing.CuptiTimer(keep_attached=True)
    fn, x = compiled_square()
    assert timer.sample(fn, [[x]], 2, 0) == pytest.approx(1e-3)
    with timing.DEVICE_LOCK:  # another tuning's sample is in its session
        closing = threading.Thread(target=timer.close)
        closing.start()
        assert not detached.wait(0.3)
    closing.join(5)
    assert detached.is_set()


def test_a_cupti_session_holds_a_bounded_number_of_outputs(monkeypatch):
    # JAX's profiler keeps every iteration's outputs until its session ends: one
    # session of many calls of a 75 MB layer norm raised an H100 process's peak by
    # 1.5 GiB. Sessions are now split so their outputs stay within the bound.
    sessions = []

    def measure(f, *, iterations=1):
        def run(*args):
            held = [f(*args) for _ in range(iterations)]  # as the profiler does
            sessions.append(len(held))
            return held, (5.0 if iterations == 1 else [5.0] * iterations)

        return run

    fake_measure_api(monkeypatch, measure)
    x = jnp.ones((512, 512), jnp.float32)  # 1 MiB out
    fn = jax.jit(lambda a: a * 2).lower(x).compile()
    assert timing.output_bytes(fn) == 1 << 20
    monkeypatch.setattr(timing, "MAX_SESSION_OUTPUT_BYTES", 3 << 20)
    assert timing.CuptiTimer().sample(fn, [[x]], 10, 0) == pytest.approx(5e-3)
    assert sessions == [3, 3, 3, 1]
    # Small outputs: one session for every call, as before.
    sessions.clear()
    monkeypatch.setattr(timing, "MAX_SESSION_OUTPUT_BYTES", 256 << 20)
    timing.CuptiTimer().sample(fn, [[x]], 10, 0)
    assert sessions == [10]
    # A function that does not say its outputs' size: one session.
    sessions.clear()
    assert timing.output_bytes(lambda a: a) is None
    timing.CuptiTimer().sample(jax.jit(lambda a: a * 2), [[x]], 4, 0)
    assert sessions == [4]


def test_cupti_failures_become_timer_failures_but_function_errors_propagate(monkeypatch):
    fn, x = compiled_square()

    def broken(f, *, iterations=1):
        def run(*args):
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

        return run

    fake_measure_api(monkeypatch, broken)
    with pytest.raises(timing.TimerFailed, match="CUPTI"):
        timing.CuptiTimer().sample(fn, [[x]], 1, 0)

    def oom(f, *, iterations=1):
        def run(*args):
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory allocating 4GiB")

        return run

    fake_measure_api(monkeypatch, oom)
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        timing.CuptiTimer().sample(fn, [[x]], 1, 0)

    fake_measure_api(monkeypatch, lambda f, iterations=1: lambda *a: (f(*a), None))
    with pytest.raises(timing.TimerFailed, match="no kernel"):
        timing.CuptiTimer().sample(fn, [[x]], 1, 0)


class FailingTimer:
    """A device timer that breaks after a few samples, as CUPTI can. Its samples read
    one second, so a sample of it that survived the fallback would show."""

    name = "cupti"

    def __init__(self, after: int) -> None:
        self.left = after

    def sample(self, fn, arg_sets, calls, start):
        if self.left <= 0:
            raise timing.TimerFailed("CUPTI measurement failed: activity buffer error")
        self.left -= 1
        jax.block_until_ready(fn(*arg_sets[0]))
        return 1.0


class CostClock(CostInProgram):
    """Stands in for the wall clock the tuner falls back to (deterministic on a loaded
    machine)."""

    name = "wallclock"


def test_a_timer_that_breaks_midway_falls_back_and_remeasures(fresh_profiler_state, monkeypatch):
    # Before: the fallback was the real wall clock, and under load it once ranked 40
    # chained matmuls ahead of one. The fallback clock is now a deterministic cost.
    from kerneltune._src.tuning import sampler

    monkeypatch.setattr(sampler.timing, "WallClockTimer", CostClock)
    x = rand((16, 16), seed=0)

    def make_fn(k):
        def f(v):
            with jax.named_scope(f"ktcost_{k}"):
                return v * 2.0

        return f

    report = Tuner(timer=FailingTimer(after=3), progress=False, target_sample_s=5e-4).tune(
        make_fn, (x,), {}, [40, 1], reference_cfg=40
    )
    assert report.timer == "wallclock"
    assert "fell back to the wall clock" in report.timer_note
    assert report.best == 1
    assert all(c.ok and len(c.samples_s) >= 1 for c in report.candidates)
    # Every candidate was measured again: no one-second sample of the broken timer is left.
    assert all(max(c.samples_s) < 1.0 for c in report.candidates)
    assert "activity buffer" in timing.profiler_conflict()


class CountingDeviceTimer:
    """A stand-in for CUPTI: counts samples and whether compiles were still running."""

    name = "cupti"

    def __init__(self) -> None:
        self.samples = 0

    def sample(self, fn, arg_sets, calls, start):
        self.samples += 1
        return timing.WallClockTimer().sample(fn, arg_sets, calls, start)


def test_device_timers_take_the_first_round_while_compiling():
    x = rand((32, 32), seed=0)
    timer = CountingDeviceTimer()
    tuner = Tuner(timer=timer, progress=False, iters=3, top_k=0, drop_factor=100.0)
    report = tuner.tune(lambda k: lambda v: v * 1.0 + k * 0.0, (x,), {}, [1, 2, 3])
    # Exactly `iters` samples each, although the first was taken while compiling.
    assert [len(c.samples_s) for c in report.candidates] == [3, 3, 3]
    assert timer.samples == 9
    assert set(report.phases_s) == {"setup", "compile", "timing", "finish", "total"}
    parts = sum(v for k, v in report.phases_s.items() if k != "total")
    assert parts <= report.phases_s["total"] * 1.01


@pytest.mark.parametrize(
    "error",
    [
        "The number of kernel launches is not divisible by the number of iterations",
        "Kernel names are not consistent across iterations",
    ],
)
def test_a_session_that_counted_other_launches_runs_again(monkeypatch, error):
    """CUPTI counts every kernel the process launches during a session: XLA autotuning
    in a compile on another thread made the count uneven on an H200, and that one error
    sent the rest of the process's tuning to the wall clock. Such a session now runs
    again; only an error that persists still fails the timer."""
    fn, x = compiled_square()
    failures = {"left": timing.FOREIGN_LAUNCH_RETRIES}

    def measure(f, *, iterations=1):
        def run(*args):
            if failures["left"] > 0:
                failures["left"] -= 1
                raise RuntimeError(error)
            return f(*args), [2.0] * iterations

        return run

    fake_measure_api(monkeypatch, measure)
    assert timing.CuptiTimer().sample(fn, [[x]], 4, 0) == pytest.approx(2e-3)
    assert failures["left"] == 0

    failures["left"] = timing.FOREIGN_LAUNCH_RETRIES + 1  # it persists
    with pytest.raises(timing.TimerFailed, match=r"kernel launches|Kernel names"):
        timing.CuptiTimer().sample(fn, [[x]], 4, 0)


def test_a_session_run_again_waits_for_other_threads_compiles_and_holds_new_ones(monkeypatch):
    """Running again alone did not help on an H200: while the grouped matmul's XLA
    candidate compiled (its autotuning launches kernels) every retry counted its
    launches too, and 4 keys of a shipped table were timed by the wall clock. The
    retried session now waits for the other threads' compiles to end and starts no new
    one until it is done: it never overlaps a compile on another thread."""
    monkeypatch.setattr(timing, "FOREIGN_LAUNCH_QUIET_S", 5.0)
    fn, x = compiled_square()
    log: list[str] = []
    compiling_now, release, second_started = threading.Event(), threading.Event(), threading.Event()

    def other_compile(name: str, started: threading.Event) -> None:
        with stages.exit_waits_for_this():
            log.append(f"{name} starts")
            started.set()
            release.wait(5)
            log.append(f"{name} ends")

    first = threading.Thread(target=other_compile, args=("compile 1", compiling_now))
    first.start()
    compiling_now.wait(5)
    second = threading.Thread(target=other_compile, args=("compile 2", second_started))
    sessions = []

    def measure(f, *, iterations=1):
        def run(*args):
            sessions.append(len(sessions))
            if len(sessions) == 1:  # a compile on another thread spoils the first session
                log.append("session fails")
                threading.Timer(0.2, release.set).start()
                raise RuntimeError(
                    "The number of kernel launches is not divisible by the number of iterations"
                )
            second.start()  # asks to start during the retried session: it must wait
            # Not started within a second: held (a free thread starts in microseconds).
            log.append(f"compile 2 held: {not second_started.wait(1.0)}")
            log.append("session runs")
            return f(*args), [2.0] * iterations

        return run

    fake_measure_api(monkeypatch, measure)
    assert timing.CuptiTimer().sample(fn, [[x]], 4, 0) == pytest.approx(2e-3)
    second.join(5)
    first.join(5)
    assert log == [
        "compile 1 starts",
        "session fails",
        "compile 1 ends",
        "compile 2 held: True",
        "session runs",
        "compile 2 starts",
        "compile 2 ends",
    ]


def test_a_pausing_thread_may_run_stages_and_a_running_stage_may_nest():
    """The thread that pauses the others may compile inside (a session may build), and
    a stage nested in one already running on another thread is not held up (it would
    keep the outer one, which the pauser waits for, from ending)."""
    inner_done, outer_started, go_on = threading.Event(), threading.Event(), threading.Event()

    def outer() -> None:
        with stages.exit_waits_for_this():
            outer_started.set()
            go_on.wait(5)
            with stages.exit_waits_for_this():  # nested: starts although paused
                inner_done.set()

    t = threading.Thread(target=outer)
    t.start()
    outer_started.wait(5)
    threading.Timer(0.1, go_on.set).start()
    with stages.others_paused(5.0) as quiet:
        assert quiet
        assert inner_done.is_set()
        with stages.exit_waits_for_this():  # the pauser's own stage
            pass
    t.join(5)


def test_an_error_or_interrupt_inside_a_pause_lets_the_other_threads_go():
    """A pause that ended by an exception (an interrupt while waiting included) must
    not leave every other thread's compiles held for the rest of the process."""

    def starts_on_another_thread() -> bool:
        started = threading.Event()

        def stage() -> None:
            with stages.exit_waits_for_this():
                started.set()

        threading.Thread(target=stage, daemon=True).start()
        return started.wait(5)

    with pytest.raises(KeyboardInterrupt):
        with stages.others_paused(5.0):
            raise KeyboardInterrupt
    assert starts_on_another_thread()

    blocker_in, blocker_out = threading.Event(), threading.Event()

    def blocker() -> None:
        with stages.exit_waits_for_this():
            blocker_in.set()
            blocker_out.wait(5)

    threading.Thread(target=blocker, daemon=True).start()
    blocker_in.wait(5)
    # Interrupted while waiting for the running stage to end.
    real_wait_for = stages._running_changed.wait_for

    def interrupted(predicate, timeout=None):
        if timeout is not None:
            raise KeyboardInterrupt
        return real_wait_for(predicate, timeout)

    stages._running_changed.wait_for = interrupted  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            with stages.others_paused(5.0):
                pass
    finally:
        stages._running_changed.wait_for = real_wait_for  # type: ignore[method-assign]
        blocker_out.set()
    assert starts_on_another_thread()


def test_other_cupti_errors_are_not_run_again(monkeypatch):
    fn, x = compiled_square()
    calls = []

    def broken(f, *, iterations=1):
        def run(*args):
            calls.append(1)
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

        return run

    fake_measure_api(monkeypatch, broken)
    with pytest.raises(timing.TimerFailed):
        timing.CuptiTimer().sample(fn, [[x]], 1, 0)
    assert len(calls) == 1
