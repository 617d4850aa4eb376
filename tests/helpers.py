"""Small kernels and tools shared by the tests."""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np

import kerneltune as kt

#: This folder, and the checkout's root: what a worker process needs on `PYTHONPATH` to
#: import this checkout's `kerneltune` and `tests` (not an installed copy's).
TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent


def xla_flags_with_devices(count: int) -> str:
    """This process's XLA flags (the root conftest.py's, which make compiles cheaper) with
    `count` CPU devices instead of its four: for the processes of a job a test starts."""
    flag = "--xla_force_host_platform_device_count"
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(flag)]
    return " ".join([f"{flag}={count}", *kept])


class Layout(enum.Enum):
    """An enum field for config types that must round-trip through files."""

    ROW = "row"
    COL = "col"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RepCfg:
    """How many times the kernel repeats its work: cost grows with `reps`."""

    reps: int = 1


class RepeatKernel(kt.Kernel):
    """`sin` applied `reps` times then scaled: a kernel whose candidates differ
    several-fold in cost while their results stay deterministic per config."""

    op_id = "repeat"

    def __init__(
        self, candidates=(RepCfg(reps=40), RepCfg(reps=1), RepCfg(reps=8)), heuristic=RepCfg(reps=8)
    ):
        super().__init__()
        self._candidates = tuple(candidates)
        self._heuristic = heuristic

    def run(self, x, *, cfg, alpha=1.0):
        # Every config computes the same function: sin∘...∘sin then undone by the
        # parity-free trick of adding and subtracting, so only cost differs.
        y = x
        for _ in range(cfg.reps):
            y = y + jnp.sin(y) * 0.0
        return y * alpha

    def heuristic_cfg(self, inv):
        return self._heuristic

    def candidate_cfgs(self, inv):
        return self._candidates


def matmul_chain(x, reps):
    y = x
    for _ in range(reps):
        y = jnp.tanh(y @ x) * 0.5
    return y


class CostKernel(kt.Kernel):
    """Candidates cost `reps` matrix products; the result is the same for all."""

    op_id = "cost"

    def run(self, x, *, cfg):
        y = x
        with jax.named_scope(f"ktcost_{cfg.reps}"):  # what `CostInProgram` reads
            for _ in range(cfg.reps):
                y = y + 0.0 * (y @ x)
        return y

    def heuristic_cfg(self, inv):
        return RepCfg(reps=4)

    def candidate_cfgs(self, inv):
        return [RepCfg(reps=16), RepCfg(reps=1), RepCfg(reps=4)]


class CostInProgram:
    """A deterministic timer: a program's cost is the largest `N` of the
    `ktcost_N` named scopes compiled into it, so winner assertions hold on a loaded
    machine (the program still runs, so failures at run time still show)."""

    name = "cost-in-program"

    def sample(self, fn, arg_sets, calls, start):
        jax.block_until_ready(fn(*arg_sets[start % len(arg_sets)]))
        costs = [int(c) for c in re.findall(r"ktcost_(\d+)", fn.as_text())]
        return (max(costs) if costs else 1) * 1e-6


def costed_sin(fwd: int, bwd: int):
    """`sin(x)` with a custom gradient whose forward and backward cost `fwd` and `bwd`
    (`ktcost_N` scopes, read by `CostInProgram`): a backend that brings its own
    backward, as XLA's or tokamax's does."""

    @jax.custom_vjp
    def f(x):
        with jax.named_scope(f"ktcost_{fwd}"):
            return jnp.sin(x) * 1.0

    def f_fwd(x):
        return f(x), x

    def f_bwd(x, g):
        with jax.named_scope(f"ktcost_{bwd}"):
            return (jnp.cos(x) * g,)

    f.defvjp(f_fwd, f_bwd)
    return f


def cost_tuner(**kw):
    """A tuner with the deterministic cost timer and short samples."""
    kw.setdefault("target_sample_s", 5e-4)
    return kt.Tuner(timer=CostInProgram(), **kw)


def executor(*, events=None, tuner=None, persistent=None, **policy):
    """An executor over a fresh memory cache, with `AutotunePolicy(**policy)`; its
    selector appends `(event, data)` to `events` when a list is given."""
    on_event = None if events is None else (lambda e, **d: events.append((e, d)))
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(**policy),
        tuner=tuner,
        persistent=persistent,
        on_event=on_event,
    )
    return kt.Executor(chain)


def heuristics_executor(events=None):
    """An executor that never tunes: misses use the kernel's heuristic."""
    return executor(events=events, cache_miss_fallback="heuristics")


def events_recorder():
    events = []

    def on_event(event, **data):
        events.append((event, data))

    return events, on_event


def names(events):
    return [e for e, _ in events]


def rand(shape, dtype=jnp.float32, *, seed=None):
    """Standard normal values drawn in float32, then cast to `dtype`; a fresh seed unless
    one is given (`rand_from` says how they are drawn)."""
    seed = np.random.randint(0, 2**31 - 1) if seed is None else seed
    return rand_from(jax.random.PRNGKey(seed), shape, dtype)


def rand_from(key, shape, dtype=jnp.float32):
    """Standard normal values drawn in float32 from the JAX key `key`, then cast to
    `dtype`.

    On a CPU NumPy draws them (`host_rng`): JAX's generator compiles a program (and
    the cast another) for every new shape, about 0.1 s each, which the tests' many
    shapes added up to tens of seconds of the suite. On an accelerator JAX draws them
    as before (`jax.random.normal`), so the GPU tests keep the inputs their seeds gave."""
    if jax.default_backend() == "cpu":
        return normal(host_rng(key), shape, dtype)
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def normal(rng, shape, dtype=jnp.float32, *, loc=0.0, scale=1.0):
    """Normal values of mean `loc` and deviation `scale`, drawn in float32 by the NumPy
    generator `rng`, then cast to `dtype` (a JAX array). JAX's generator would compile a
    program for every new shape, about 0.1 s each: tests over many shapes paid it for
    every one."""
    drawn = np.float32(loc) + rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
    return jnp.asarray(drawn.astype(dtype))


def host_rng(key):
    """A NumPy generator seeded by the JAX key `key` (the `key` fixture's, whose seed
    the test prints), for `normal`."""
    return np.random.default_rng(np.asarray(jax.random.key_data(key)))


def close(actual, expected, *, tol):
    """Asserts that `actual` has `expected`'s shape and matches it element-wise, in
    float32, within `tol` relative to each element and `tol` times the largest
    magnitude of `expected` (at least 1) absolute."""
    # Cast on the host: JAX's cast compiles a program for every shape and dtype.
    actual = np.asarray(actual).astype(np.float32)
    expected = np.asarray(expected).astype(np.float32)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(1.0, float(np.abs(expected).max(initial=0)))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)


def value_and_grads(fn, args, dout, *, jit=True):
    """`fn(*args)` and the gradients of `sum(fn(*args) * dout)` with respect to every
    argument (`dout` is cast to the output's dtype), traced as one jitted program, or
    run op by op with `jit=False`."""

    def both(args, dout):
        out, pullback = jax.vjp(fn, *args)
        return out, pullback(dout.astype(out.dtype))

    return (jax.jit(both) if jit else both)(tuple(args), dout)


class FixedChooser:
    """A config chooser that picks `cfg` for every call and counts the calls."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.calls = 0

    def choose(self, inv, kernel):
        self.calls += 1
        return self.cfg
