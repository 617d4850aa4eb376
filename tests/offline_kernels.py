"""Kernels for the recording, offline, batching and sharding tests.

They live in a module of their own so that another process (`python -m kerneltune tune`)
can import them by name from a manifest. There are no tests here.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

import kerneltune as kt
from tests.helpers import cost_tuner


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopCfg:
    """`reps` matrix products whose results are thrown away: cost grows with `reps`,
    the output does not change."""

    reps: int = 6


CANDIDATES = (LoopCfg(reps=16), LoopCfg(reps=1), LoopCfg(reps=6))
CHEAPEST = LoopCfg(reps=1)
HEURISTIC = LoopCfg(reps=6)


def busy(x, reps):
    """`x`, after `reps` wasted matrix products with itself (x must be square in its
    last two dimensions). The cost is also written into the program (a named scope),
    where `CostInProgram` reads it."""

    def body(_, y):
        return y + 0.0 * jnp.tanh(y @ x)

    with jax.named_scope(f"ktcost_{reps}"):
        return jax.lax.fori_loop(0, reps, body, x)


def fast_tuner():
    """The tuner the tests use: deterministic costs, short samples."""
    return cost_tuner()


def tuning_executor(fallback="autotune", persistent=None):
    """An executor with the fast tuner, and the list its selector's events land in."""
    events = []

    def on_event(event, **data):
        events.append((event, data))

    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(cache_miss_fallback=fallback),
        tuner=fast_tuner(),
        persistent=persistent,
        on_event=on_event,
    )
    return kt.Executor(chain), events


def started(events):
    return [d for e, d in events if e == "autotune_start"]


class LoopKernel(kt.Kernel):
    """`alpha * x`; its candidates differ several-fold in cost."""

    op_id = "loop"

    def run(self, x, *, cfg, alpha=1.0):
        return busy(x, cfg.reps) * alpha

    def heuristic_cfg(self, inv):
        return HEURISTIC

    def candidate_cfgs(self, inv):
        return CANDIDATES


class ScaledKernel(kt.Kernel):
    """`scale * x`, with a constructor argument that a manifest must carry."""

    op_id = "scaled"

    def __init__(self, scale=2.0, op_id=None):
        super().__init__(op_id)
        self.scale = scale

    def manifest_kwargs(self):
        return {"scale": self.scale, "op_id": self.op_id}

    def run(self, x, *, cfg):
        return busy(x, cfg.reps) * self.scale

    def heuristic_cfg(self, inv):
        return HEURISTIC

    def candidate_cfgs(self, inv):
        return CANDIDATES


class SinBwdKernel(kt.Kernel):
    """The backward kernel of `SinKernel`: `g * cos(x)`."""

    op_id = "sin_bwd"

    def run(self, g, x, *, cfg):
        return busy(g, cfg.reps) * jnp.cos(x)

    def heuristic_cfg(self, inv):
        return HEURISTIC

    def candidate_cfgs(self, inv):
        return CANDIDATES


class SinKernel(kt.Kernel):
    """`sin(x)`, whose gradient runs `SinBwdKernel` through the same executor, so the
    forward and the backward kernel are tuned separately."""

    op_id = "sin_fwd"

    def __init__(self, executor=None):
        super().__init__()
        self.executor = executor

    def run(self, x, *, cfg):
        return jnp.sin(busy(x, cfg.reps))

    def fwd_with_residuals(self, x, *, cfg):
        return self.run(x, cfg=cfg), None

    def vjp(self, residuals, out, dout, x, *, cfg):
        executor = self.executor or kt.default_executor()
        return (executor(SinBwdKernel(), dout, x),)

    def heuristic_cfg(self, inv):
        return HEURISTIC

    def candidate_cfgs(self, inv):
        return CANDIDATES


class ShapeSpy(kt.Kernel):
    """`2 * x`; remembers the argument shapes its hooks were asked about."""

    op_id = "spy"

    def __init__(self):
        super().__init__()
        self.seen = []

    def run(self, x, *, cfg):
        return 2.0 * busy(x, cfg.reps)

    def heuristic_cfg(self, inv):
        self.seen.append(("heuristic", tuple(inv.args[0].shape)))
        return HEURISTIC

    def candidate_cfgs(self, inv):
        self.seen.append(("candidates", tuple(inv.args[0].shape)))
        return CANDIDATES


class ShardAwareKernel(ShapeSpy):
    """Like `ShapeSpy`, with its own per-shard implementation (`3 * x`)."""

    op_id = "shard_aware"

    def run_shard_map(self, x, *, cfg):
        return 3.0 * busy(x, cfg.reps)
