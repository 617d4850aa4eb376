"""Tuning lowers one program at a time: two threads tracing and lowering at once
crashed the process (a segmentation fault in JAX's Pallas interpreter lowering)."""

from __future__ import annotations

import contextvars
import threading
import time

import jax
import jax.numpy as jnp
import pytest

from kerneltune._src.tuning import programs
from kerneltune._src.tuning.tuner import Tuner
from tests.helpers import CostInProgram


class Overlap:
    """Counts the traces in progress: `most` is the largest number seen at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0

    def traced(self, hold_s: float):
        def f(x):
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            time.sleep(hold_s)  # a slow trace, without the GIL: what a stall looks like
            with self.lock:
                self.now -= 1
            return x * 2.0

        return f


def test_lowerings_from_several_threads_take_turns():
    overlap = Overlap()
    x = jnp.ones((4,))
    threads = [
        threading.Thread(target=programs.lower_alone, args=(overlap.traced(0.1), [x]))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert overlap.most == 1


def test_the_tuner_never_traces_two_candidates_at_once():
    # Each trace outlasts the lowering lane's stall threshold (0.25 s), which used to
    # start a helper thread lowering the next candidate alongside it.
    overlap = Overlap()
    tuner = Tuner(iters=2, timer=CostInProgram(), progress=False, target_sample_s=5e-4)
    report = tuner.tune(
        lambda cfg: overlap.traced(0.35),
        [jnp.ones((8,))],
        {},
        [1, 2, 3],
        reference_cfg=1,
    )
    assert all(c.status == "ok" for c in report.candidates), report.candidates
    assert overlap.most == 1


def test_a_lowering_nested_in_the_holders_goes_ahead():
    x = jnp.ones((4,))
    seen = []

    def inner(v):
        return v + 1.0

    def outer(v):
        # Same thread, and a thread running in a copy of the holder's context (what
        # the compile pool's jobs get): neither waits for the lock the holder has.
        seen.append(programs.lower_alone(inner, [x], wait_s=5.0))
        ctx = contextvars.copy_context()
        t = threading.Thread(
            target=ctx.run, args=(lambda: seen.append(programs.lower_alone(inner, [x], 5.0)),)
        )
        t.start()
        t.join(10)
        return v * 2.0

    programs.lower_alone(outer, [x], wait_s=5.0)
    assert len(seen) == 2 and all(hasattr(s, "compile") for s in seen)


def test_a_lowering_that_waits_too_long_fails_instead_of_hanging():
    release = threading.Event()
    holding = threading.Event()

    def stuck(v):
        holding.set()
        release.wait(10)
        return v

    holder = threading.Thread(target=programs.lower_alone, args=(stuck, [jnp.ones((2,))]))
    holder.start()
    assert holding.wait(10)
    try:
        with pytest.raises(TimeoutError, match="another lowering held JAX's tracer"):
            programs.lower_alone(lambda v: v, [jnp.ones((2,))], wait_s=0.3)
        # The holder is past the wait already: the next candidates fail at once.
        start = time.perf_counter()
        for _ in range(3):
            with pytest.raises(TimeoutError):
                programs.lower_alone(lambda v: v, [jnp.ones((2,))], wait_s=0.3)
        assert time.perf_counter() - start < 0.6  # waiting would take 0.9 s
    finally:
        release.set()
        holder.join(10)
    assert programs.lower_alone(lambda v: v, [jnp.ones((2,))], wait_s=1.0) is not None


def test_jax_still_lowers_what_it_is_given():
    lowered = programs.lower_alone(lambda a, b: a @ b, [jnp.ones((2, 3)), jnp.ones((3, 4))])
    out = lowered.compile()(jnp.ones((2, 3)), jnp.ones((3, 4)))
    assert out.shape == (2, 4) and float(out[0, 0]) == 3.0
    assert jax.jit(lambda a: a).lower(jnp.ones(1)) is not None  # the lock is free again


def test_a_holder_lets_others_lower_while_a_kernel_in_its_trace_tunes():
    # A training candidate's backward calls kernels that tune their own keys in the
    # middle of its trace: seconds of compiles and timing in which other tunings'
    # lowerings used to wait for the lock the holder kept.
    x = jnp.ones((4,))
    released, lowered_beside = threading.Event(), threading.Event()
    inside_again: list[bool] = []

    def outer(v):
        with programs.lowering_released():
            released.set()
            assert lowered_beside.wait(5)  # another thread lowered meanwhile
        inside_again.append(programs._LOWERING.locked())  # taken back
        return v * 2.0

    def beside():
        assert released.wait(5)
        programs.lower_alone(lambda v: v + 1.0, [x], wait_s=2.0)
        lowered_beside.set()

    other = threading.Thread(target=beside)
    other.start()
    programs.lower_alone(outer, [x], wait_s=5.0)
    other.join(10)
    assert lowered_beside.is_set() and inside_again == [True]
    assert not programs._LOWERING.locked()


def test_only_the_holders_own_thread_lets_go_of_the_lock():
    # A job in a copy of the holder's context lowers under the holder's turn; letting
    # go there would free a lock another thread's trace is in the middle of.
    x = jnp.ones((4,))
    seen: list[bool] = []

    def outer(v):
        ctx = contextvars.copy_context()

        def job():
            with programs.lowering_released():
                seen.append(programs._LOWERING.locked())

        t = threading.Thread(target=ctx.run, args=(job,))
        t.start()
        t.join(10)
        return v

    programs.lower_alone(outer, [x], wait_s=5.0)
    assert seen == [True]
