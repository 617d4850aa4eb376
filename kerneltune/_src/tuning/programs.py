"""The programs a tuning builds around a candidate: its arguments split into arrays and
constants (made concrete), the forward + backward program that validates gradients too,
the lowering and compile stages of a config and of the reference implementation, and
advisory work run in the background."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from kerneltune._src.core import keys, tracing
from kerneltune._src.tuning import inputs, memory, stages

logger = logging.getLogger("kerneltune")


def split_static(args: Sequence[Any], kwargs: dict[str, Any]):
    """Splits (args, kwargs) into their array leaves and a function that rebuilds them
    from new array leaves (non-array leaves stay as constants)."""
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
    positions = [i for i, leaf in enumerate(leaves) if keys.is_array(leaf)]
    arrays = [leaves[i] for i in positions]

    def rebuild(new_arrays: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        full = list(leaves)
        for i, a in zip(positions, new_arrays, strict=True):
            full[i] = a
        a, k = jax.tree_util.tree_unflatten(treedef, full)
        return a, k

    return arrays, rebuild


def concrete_arrays(args: Sequence[Any], kwargs: dict[str, Any], *, seed: int):
    """`split_static(args, kwargs)` with the array leaves made concrete (random data for
    `ShapeDtypeStruct`s), even when the caller is being traced.

    Only this runs under `jax.ensure_compile_time_eval`: the programs are lowered
    outside any trace (`tracing.outside_traces`) but without constant folding, which
    would evaluate what does not depend on the inputs (a reference's score matrix, its
    gradient) at trace time and embed it in the program as a constant, and breaks
    Pallas kernel bodies that build constants ("captures constants").
    """
    with jax.ensure_compile_time_eval():
        arrays, rebuild = split_static(args, kwargs)
        return inputs.concrete_inputs(arrays, seed=seed), rebuild


def calling(fn: Callable[..., Any], rebuild: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` called on the arguments `rebuild` makes from array leaves: the program a
    tuning lowers, which takes only the arrays."""

    def call(*arrays: Any) -> Any:
        a, k = rebuild(arrays)
        return fn(*a, **k)

    return call


def lowering(
    make_fn: Callable[[Any], Callable[..., Any]],
    rebuild: Callable[..., Any],
    arrays: Sequence[Any],
    *,
    backward: bool,
) -> Callable[[Any], Any]:
    """The first build stage of a config: `make_fn(cfg)` (with its backward when
    `backward`) lowered on `arrays`."""

    def lower(cfg: Any) -> Any:
        call = calling(make_fn(cfg), rebuild)
        return lower_alone(with_backward(call) if backward else call, arrays)

    return lower


def expected_output(
    reference_fn: Callable[..., Any], rebuild: Callable[..., Any], *, backward: bool
) -> Callable[[list[list[Any]]], Any]:
    """Makes the output of the op's reference implementation on the first argument set,
    which every candidate's output is then compared with."""

    def expected(sets: list[list[Any]]) -> Any:
        call = calling(reference_fn, rebuild)
        target = with_backward(call) if backward else call
        # Where the float32 reference would not fit (long sequences), the heuristic
        # config's output is the bar instead.
        compiled = compile_lowered(lower_alone(target, sets[0]), "the reference implementation")
        return jax.block_until_ready(compiled(*sets[0]))

    return expected


def with_backward(call: Callable[..., Any]) -> Callable[..., Any]:
    """Forward + backward: the output and the gradient of the sum of its floating-point
    leaves with respect to every floating-point input (so validation covers both)."""

    def forward_and_grads(*arrays: Any) -> Any:
        float_positions = [i for i, a in enumerate(arrays) if jnp.issubdtype(a.dtype, jnp.inexact)]
        if not float_positions:
            return call(*arrays), ()

        def loss(*float_arrays: Any) -> Any:
            full = list(arrays)
            for i, a in zip(float_positions, float_arrays, strict=True):
                full[i] = a
            out = call(*full)
            leaves = [
                leaf
                for leaf in jax.tree_util.tree_leaves(out)
                if jnp.issubdtype(leaf.dtype, jnp.inexact)
            ]
            total = sum((jnp.sum(leaf.real.astype(jnp.float32)) for leaf in leaves), jnp.float32(0))
            return total, out

        # Array keyword arguments of a kernel with a custom gradient get zeros.
        with tracing.keyword_cotangents_zero():
            grads, out = jax.grad(loss, argnums=tuple(range(len(float_positions))), has_aux=True)(
                *[arrays[i] for i in float_positions]
            )
        return out, grads

    return forward_and_grads


#: One JAX lowering at a time in this process (see `lower_alone`).
_LOWERING = threading.Lock()
#: Set in the context of the lowering that holds `_LOWERING` (and copied into the jobs
#: it submits): a lowering nested in it goes ahead.
_HOLDS_LOWERING = contextvars.ContextVar("kerneltune_holds_lowering", default=False)
#: How long a lowering waits for another to finish before it fails.
LOWERING_WAIT_S = 300.0
#: When the lowering holding `_LOWERING` took it (`time.monotonic()`; None: free).
_held_since: float | None = None
#: The thread that took `_LOWERING` (None: free). Jobs a holder submits see
#: `_HOLDS_LOWERING` too, but only the holder's own thread may let go of the lock.
_holder: int | None = None


def lower_alone(fn: Callable[..., Any], args: Sequence[Any], wait_s: float = LOWERING_WAIT_S):
    """`jax.jit(fn).lower(*args)`, while no other tuning thread lowers.

    Two threads tracing and lowering at once crashed the process. It was a segmentation
    fault inside jax 0.10's Pallas interpreter lowering, in CI under load: a stalled
    lowering lane gets a helper thread, and the reference is lowered on the caller's
    thread while the lane works. Tracing holds the GIL, so taking turns costs no
    parallelism; compiles still overlap.

    A lowering nested in the holder's, such as a kernel that tunes another op while it
    is traced, runs in a context copied from the holder. The holder is waiting on it, so
    it goes ahead (where the tuning lets go of the lock, `lowering_released`, its
    lowerings take turns with everyone's instead). A `TimeoutError` fails this candidate once the holder has held the
    lock for `wait_s`, so the tuning does not hang behind a lowering that never ends:
    the first candidate behind it waits out the rest of `wait_s`, the next ones fail at
    once.
    """
    global _held_since, _holder
    if _HOLDS_LOWERING.get():
        return jax.jit(fn).lower(*args)
    since = _held_since  # read without the lock: only a holder writes it
    left = wait_s if since is None else max(0.0, wait_s - (time.monotonic() - since))
    if not _LOWERING.acquire(timeout=left):
        raise TimeoutError(
            f"another lowering held JAX's tracer for more than {wait_s:.0f} s; not lowered"
        )
    _held_since, _holder = time.monotonic(), threading.get_ident()
    token = _HOLDS_LOWERING.set(True)
    try:
        return jax.jit(fn).lower(*args)
    finally:
        _HOLDS_LOWERING.reset(token)
        _held_since = _holder = None
        _LOWERING.release()


@contextlib.contextmanager
def lowering_released() -> Iterator[None]:
    """Lets go of the lowering lock for the block, when this context holds it, and
    takes it back after.

    A kernel traced inside a lowering (a training candidate's backward calls the
    gradient kernels) tunes its own key, or waits for another thread tuning that key,
    in the middle of the holder's trace. That takes seconds of compiles and timing, in
    which the holder's trace does nothing: holding the lock through them stalled every
    other tuning's lowering (and a thread tuning that key, which needs the lock to
    lower its candidates, waited out `LOWERING_WAIT_S`). The nested tuning's own
    lowerings take turns with everyone's, as at the top level.
    """
    global _held_since, _holder
    if not _HOLDS_LOWERING.get() or _holder != threading.get_ident():
        yield  # not held, or held by the lowering this job is part of: it goes ahead
        return
    token = _HOLDS_LOWERING.set(False)
    _held_since = _holder = None
    _LOWERING.release()
    try:
        yield
    finally:
        _LOWERING.acquire()
        _held_since, _holder = time.monotonic(), threading.get_ident()
        _HOLDS_LOWERING.reset(token)


def compile_lowered(lowered: Any, what: str = "this candidate") -> Any:
    """The second build stage: a lowered program's executable, refused (`DoesNotFit`,
    recorded as "oom") when it would not fit in the device memory left."""
    compiled = lowered.compile()
    memory.check_fits(compiled, what)
    return compiled


class Background:
    """Runs `fn(*args)` on a daemon thread; `result()` waits for it (None if it
    raised: what it computes is advisory)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._result: Any = None
        # Held here, not in the thread's arguments: the thread drops them inside its
        # stage, so what they hold is freed before interpreter exit stops waiting.
        self._call: tuple[Callable[..., Any], tuple[Any, ...]] | None = (fn, args)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with stages.exit_waits_for_this():  # it may compile: exit must wait
            assert self._call is not None
            fn, args = self._call
            self._call = None
            try:
                self._result = fn(*args)
            except Exception as e:
                logger.debug("background check failed: %s", e)
            finally:
                del fn, args

    def result(self, timeout_s: float = 60.0) -> Any:
        self._thread.join(timeout_s)
        return self._result
