"""How the demo measures an implementation: the first call with its program's memory,
failures as data, and timing rounds interleaved in a rotated order."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from kerneltune._src.cli import demo_measure as dm


def test_a_first_call_is_timed_and_its_program_measured():
    x = jnp.ones((256, 256), jnp.float32)
    compiled, m = dm.first_call(lambda a: a @ a, (x,))
    assert m.status == "ok" and m.first_call_s > 0
    # Arguments + output: two float32 [256, 256] arrays at least.
    assert m.peak_bytes is not None and m.peak_bytes >= 2 * 256 * 256 * 4
    assert jnp.array_equal(compiled(x), x @ x)


def test_programs_take_the_arguments_leaves_flat():
    """As the tuner's timed programs do (the timers pass arrays, not pytrees)."""
    args = ({"w": jnp.full((2, 3), 2.0), "b": jnp.ones(3)}, jnp.ones((4, 2)))
    compiled, m = dm.first_call(lambda p, x: x @ p["w"] + p["b"], args)
    flat = dm.leaves(args)
    assert m.status == "ok" and len(flat) == 3
    assert jnp.array_equal(compiled(*flat), jnp.full((4, 3), 5.0))


def test_a_failing_first_call_is_a_measurement_not_a_crash():
    def broken(a):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate\nmore")

    compiled, m = dm.first_call(broken, (jnp.ones(3),))
    assert compiled is None and m.status == "oom" and m.first_call_s is None
    assert m.note == "RuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate"
    _, m = dm.first_call(lambda a: a.reshape(7), (jnp.ones(3),))
    assert m.status == "failed" and m.note.startswith("TypeError")


def test_rounds_rotate_the_order_and_a_program_failing_while_timed_is_set_aside():
    calls: list[str] = []

    def program(name, fail_after=None):
        def run(a):
            calls.append(name)
            if fail_after is not None and calls.count(name) > fail_after:
                raise ValueError(f"{name} broke")
            return a + 1

        return run

    programs = {"a": program("a"), "b": program("b"), "c": program("c", fail_after=1)}
    plan = dm.Rounds(rounds=3, sample_s=0.0, max_calls=1)
    times, errors, timer = dm.interleaved(programs, [(jnp.ones(2),)], plan)
    assert timer == "wallclock"
    assert calls == ["a", "b", "c", "b", "c", "a", "a", "b"]  # c set aside after failing
    assert set(times) == {"a", "b"} and all(t > 0 for t in times.values())
    assert errors == {"c": "ValueError: c broke"}


@pytest.mark.parametrize(
    "error, status",
    [("XlaRuntimeError: RESOURCE_EXHAUSTED: ...", "oom"), ("ValueError: bad shape", "failed")],
)
def test_status_of_an_error(error, status):
    assert dm.status_of(error) == status


def test_nothing_to_time_times_nothing():
    assert dm.interleaved({}, [(jax.numpy.ones(1),)], dm.CPU_ROUNDS)[:2] == ({}, {})


class _StepTimer:
    """A deterministic timer: each program's call takes the seconds its name says."""

    name = "step"

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds, self.sampled = seconds, []

    def sample(self, fn, sets, calls, start):
        self.sampled.append((fn, calls))
        return self.seconds[fn]


def test_a_long_calls_calibration_is_its_first_sample_and_a_short_one_is_not():
    # A call longer than a sample is timed one call at a time: the call that sized the
    # samples is round 0's sample (timing it again only lengthened the demo). A short
    # call's sizing call is not a sample of the size the rounds take.
    timer = _StepTimer({"long": 0.5, "short": 0.001})
    plan = dm.Rounds(rounds=3, sample_s=0.01, max_calls=50)
    times, errors, _ = dm._interleaved(timer, {"long": "long", "short": "short"}, [()], plan)
    assert errors == {} and times == {"long": 0.5, "short": 0.001}
    assert [c for f, c in timer.sampled if f == "long"] == [1, 1, 1]  # 3 rounds, no extra
    assert [c for f, c in timer.sampled if f == "short"] == [1, 10, 10, 10]  # sizing + 3


class _Outputs:
    """A program whose outputs are `nbytes` bytes (what `calls_per_session` reads)."""

    def __init__(self, nbytes: int) -> None:
        self.out_info = jax.ShapeDtypeStruct((nbytes,), jnp.uint8)


@pytest.mark.parametrize("timer_name, calls", [("cupti", 2), ("wallclock", 33)])
def test_a_cupti_sample_is_one_session(timer_name, calls):
    # A 300 us layer norm with 128 MiB of output: 33 calls make a 10 ms sample, but one
    # CUPTI session holds the outputs of 2 (`MAX_SESSION_OUTPUT_BYTES`); more calls ran
    # 17 sessions a sample, each with its own fixed cost. The wall clock has no
    # sessions and keeps the long sample.
    big = _Outputs(128 << 20)
    timer = _StepTimer({big: 300e-6})
    timer.name = timer_name
    plan = dm.Rounds(rounds=2, sample_s=0.01, max_calls=50)
    dm._interleaved(timer, {"norm": big}, [()], plan)
    assert [c for _, c in timer.sampled] == [1, calls, calls]


def test_a_second_implementation_of_the_same_program_is_not_compiled_again():
    """kerneltune untuned and as chosen lower to one program where tuning kept the
    heuristic's configs: it is compiled once, and the second first call is its own
    lowering plus the first's compile and run."""
    x = jnp.ones((64, 64), jnp.float32)
    built: dict = {}
    first, a = dm.first_call(lambda m: jnp.tanh(m @ m), (x,), built, "kt_chosen")
    again, b = dm.first_call(lambda m: jnp.tanh(m @ m), (x,), built, "kt_untuned")
    other, c = dm.first_call(lambda m: jnp.sin(m @ m), (x,), built, "plain")
    assert again is first and other is not first
    assert dm.shared_with(b) == "kt_chosen" and dm.shared_with(a) is None
    assert dm.shared_with(c) is None and c.note == ""
    # The shared program once, "plain"'s under its own text.
    assert sorted(p.impl for p in built.values()) == ["kt_chosen", "plain"]
    chosen = next(p for p in built.values() if p.impl == "kt_chosen")
    assert chosen.compiled is first and b.first_call_s > chosen.compile_run_s
    assert b.peak_bytes == a.peak_bytes
    # Without `built` (the earlier behaviour) every call compiles its own.
    alone, _ = dm.first_call(lambda m: jnp.tanh(m @ m), (x,))
    assert alone is not first
