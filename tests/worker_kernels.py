"""Kernels for the `kerneltune tune --workers` tests, imported by the worker processes
through `--import tests.worker_kernels`. There are no tests here."""

from __future__ import annotations

import os

import kerneltune as kt
from tests.offline_kernels import CANDIDATES, HEURISTIC, LoopCfg, busy

#: Set in the environment of a worker that must die on `DyingKernel`'s first call.
DIE = "KERNELTUNE_TEST_WORKER_DIES"
#: Set in the environment of workers that must time candidates with the deterministic
#: cost timer (`helpers.CostInProgram`), so that their winners do not depend on the load.
COST_TIMER = "KERNELTUNE_TEST_COST_TIMER"

if os.environ.get(COST_TIMER):
    from kerneltune._src.tuning import timing
    from tests.helpers import CostInProgram

    timing.choose_timer = lambda preference="auto": (CostInProgram(), None)


class SteadyKernel(kt.Kernel):
    """`2 * x`, with candidates that differ several-fold in cost."""

    op_id = "aaa_steady"

    def run(self, x, *, cfg):
        return busy(x, cfg.reps) * 2.0

    def heuristic_cfg(self, inv):
        return HEURISTIC

    def candidate_cfgs(self, inv):
        return CANDIDATES


class DyingKernel(SteadyKernel):
    """Like `SteadyKernel`, but takes its whole process down while being tuned when
    `DIE` is set (a segfault or an illegal memory access would do the same). Its op id
    sorts last, so a worker tunes its other keys first."""

    op_id = "zzz_dying"

    def run(self, x, *, cfg):
        if os.environ.get(DIE):
            os._exit(3)
        return super().run(x, cfg=cfg)


#: Set in the environment of a process whose `SleepyKernel` takes seconds to build.
SLEEP = "KERNELTUNE_TEST_SLEEPY_SECONDS"


class SleepyKernel(SteadyKernel):
    """Like `SteadyKernel`, but building each candidate takes `SLEEP` seconds (a slow
    compile), so that a test can interrupt the tuning in the middle. Sorts last."""

    op_id = "zzz_sleepy"

    def run(self, x, *, cfg):
        import time

        time.sleep(float(os.environ.get(SLEEP, "0")))
        return super().run(x, cfg=cfg)


def _on_device(x, action):
    """Runs `action()` on the host when the compiled program runs (not when it is
    traced): the way a kernel's crash or hang shows up, in the candidate's first run."""
    import jax

    def host(v):
        action()
        return v

    return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


class CrashingKernel(SteadyKernel):
    """Like `SteadyKernel`, but its candidate with `reps == 2` kills its process with a
    segfault when it runs (as an illegal memory access would)."""

    op_id = "crashing"

    def run(self, x, *, cfg):
        import signal

        if cfg.reps == 2:
            x = _on_device(x, lambda: os.kill(os.getpid(), signal.SIGSEGV))
        return super().run(x, cfg=cfg)

    def candidate_cfgs(self, inv):
        return [*CANDIDATES, LoopCfg(reps=2)]


class HangingKernel(SteadyKernel):
    """Like `SteadyKernel`, but its candidate with `reps == 2` never finishes running."""

    op_id = "hanging"

    def run(self, x, *, cfg):
        import time

        if cfg.reps == 2:
            x = _on_device(x, lambda: time.sleep(3600))
        return super().run(x, cfg=cfg)

    def candidate_cfgs(self, inv):
        return [*CANDIDATES, LoopCfg(reps=2)]
