"""The public `benchmark` and `autotune` functions.

`benchmark` times any JAX function the way the tuner does (jitted, warm-up excluded,
device timer where there is one, median of samples); `autotune` tunes one kernel call
and returns the winning config without touching any cache.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax

from kerneltune._src.core.kernel_types import Cfg
from kerneltune._src.kernel import dispatch, hooks
from kerneltune._src.kernel.base import Kernel, make_invocation
from kerneltune._src.kernel.methods import bound, methods_of
from kerneltune._src.tuning.programs import split_static
from kerneltune._src.tuning.protocol import run_tuner
from kerneltune._src.tuning.settings import check_int
from kerneltune._src.tuning.tuner import NoCandidatesError, Tuner
from kerneltune._src.workflows.tune_function import autotune_function


def benchmark(
    fn: Callable[..., Any],
    *args: Any,
    num_warmup: int = 1,
    num_iters: int = 10,
    **kwargs: Any,
) -> float:
    """Median time of one call of `fn(*args, **kwargs)`, in **milliseconds**.

    `fn` is jitted with the array leaves of the arguments as inputs (other leaves are
    constants); compiling and `num_warmup` runs are excluded. Each of the `num_iters`
    samples averages as many calls as take about a millisecond, and is device time
    (CUPTI) on a CUDA GPU when available, wall time otherwise.

    Args:
      fn: a JAX-traceable function (a `Kernel` instance works too).
      *args: its positional arguments, concrete.
      num_warmup: untimed runs before sampling (at least one always runs).
      num_iters: timed samples; the result is their median.
      **kwargs: its keyword arguments.

    Returns:
      Milliseconds per call.

    Raises:
      TypeError: `fn` is not callable.
      ValueError: `num_warmup` is not an integer >= 0 or `num_iters` not one >= 1.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune._src.workflows.benchmarking import benchmark
      >>> ms = benchmark(jnp.sin, jnp.arange(1024.0), num_iters=3)
      >>> 0 < ms < 1000
      True
    """
    if not callable(fn):
        # Checked first: otherwise the tuner's trace failed with "'int' object is not
        # callable", which names neither benchmark's argument nor what it takes.
        raise TypeError(
            f"benchmark(fn, ...) needs a function or a kerneltune.Kernel to time, got "
            f"{type(fn).__name__} ({fn!r:.80})."
        )
    _check_sample_counts("benchmark", num_warmup, num_iters)
    _warn_about_captured_arrays(fn, args, kwargs)
    tuner: Tuner[Any] = Tuner(warmup=num_warmup, iters=num_iters)
    return tuner.measure(fn, *args, **kwargs) * 1e3


def _check_sample_counts(where: str, num_warmup: Any, num_iters: Any) -> None:
    # Checked here, not only by `Tuner`, so that the error names the arguments the
    # caller wrote (`num_iters`), not the tuner's (`iters`).
    check_int("num_warmup", num_warmup, 0, where=where)
    check_int("num_iters", num_iters, 1, where=where)


def _warn_about_captured_arrays(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Arrays `fn` closes over become compile-time constants of the timed program, so
    XLA may compute part of the work while compiling and the time is too low (e.g.
    `benchmark(lambda: op(x))` timed 0.0046 ms for a 0.14 ms op)."""
    arrays, rebuild = split_static(args, kwargs)

    def call(*a: Any) -> Any:
        aa, kk = rebuild(a)
        return fn(*aa, **kk)

    consts = [c for c in jax.make_jaxpr(call)(*arrays).consts if getattr(c, "ndim", 0) > 0]
    if consts:
        shapes = ", ".join(f"{c.dtype}{list(c.shape)}" for c in consts[:4])
        warnings.warn(
            f"benchmark: fn closes over {len(consts)} array(s) ({shapes}); they become "
            "compile-time constants, so XLA may precompute part of the work and the time "
            "is too low. Pass them as arguments: benchmark(fn, x) rather than "
            "benchmark(lambda: fn(x)).",
            stacklevel=3,
        )


def autotune(
    kernel: Kernel[Cfg, Any] | Callable[..., Any],
    *args: Any,
    configs: Iterable[Cfg] | None = None,
    num_warmup: int = 1,
    num_iters: int = 3,
    tuner: Tuner[Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Tunes one kernel call and returns the fastest config; or, given any function,
    tunes every kerneltune call in it and returns an `AutotuningResult`.

    **A whole function** (`kernel` is not a `Kernel`): `f` is traced and lowered once
    (nothing is benchmarked while tracing), every kerneltune call in it — forward and
    backward kernels — is tuned over its kernel's candidates, and the winners go to
    the default executor's caches (memory, and the persistent cache when one is
    configured), so the next call of `f` uses them, even a jitted `f` traced before.
    `configs`, `num_warmup` and `num_iters` apply to the kernel form only; `tuner`
    replaces the default executor's tuner for this call. For example,
    `kerneltune.autotune(jax.value_and_grad(loss), params, batch)` tunes the forward
    and backward kernels of a training step.

    **One kernel call:**

    Candidates are `configs`, or the kernel's `candidate_cfgs`/`config_space` for this
    platform. Each is compiled (in parallel), checked against the kernel's heuristic
    config's output, and timed; nothing is written to any cache (wrap the result in
    `cfg=` or an overlay to use it).

    Args:
      kernel: the kernel to tune.
      *args: its positional arguments (concrete arrays; `ShapeDtypeStruct`s are
        replaced by random data).
      configs: the candidate configs (default: the kernel's candidate space).
      num_warmup: untimed runs per candidate.
      num_iters: timed samples per candidate.
      tuner: a configured `Tuner` (strategy, budget, timer, ...); when given,
        `num_warmup` and `num_iters` are ignored.
      **kwargs: the kernel's keyword arguments.

    Returns:
      The winning config (kernel form), or an `AutotuningResult` (function form).

    Raises:
      TypeError: `kernel` is neither a Kernel nor callable, `configs` was given with a
        function, or the kernel defines no candidate space and no `configs` were given.
      ValueError: there are no candidates, or `num_warmup`/`num_iters` is not an
        integer >= 0/>= 1.
      ExceptionGroup: every candidate failed (its exceptions name each one's error).
    """
    if not isinstance(kernel, Kernel):
        if not callable(kernel):
            raise TypeError(
                f"autotune needs a kerneltune.Kernel instance or a function, got "
                f"{type(kernel).__qualname__}."
            )
        if configs is not None:
            raise TypeError(
                "autotune(f, ...): configs= applies to a Kernel; the calls in a function "
                "are tuned over each kernel's own candidates."
            )
        return autotune_function(kernel, args, kwargs, tuner=tuner)

    _check_sample_counts("autotune", num_warmup, num_iters)
    prepared = kernel.prepare(*args, **kwargs)
    p_args, p_kwargs = tuple(prepared[0]), dict(prepared[1])
    inv = make_invocation(kernel, p_args, p_kwargs)
    if configs is None:
        hook = bound(kernel, methods_of(kernel).candidates)
        if hook is None:
            raise TypeError(
                f"kernel {kernel.op_id!r} ({type(kernel).__name__}) defines no "
                "candidate_cfgs/config_space for this platform; pass configs=[...]."
            )
        configs = hook(inv)
    candidates = list(configs)
    if not candidates:
        raise NoCandidatesError(
            f"autotune got no candidate configs for {inv.op_id_v}({inv.signature})."
        )
    for i, cand in enumerate(candidates):
        hooks.check_config_type(kernel, inv, cand, f"candidate #{i}")
    heuristic = hooks.find_heuristic(kernel, inv)
    t_args, t_kwargs = hooks.concrete_inputs(kernel, inv)
    if tuner is None:
        tuner = Tuner(warmup=num_warmup, iters=num_iters)

    def make_fn(cfg: Any) -> Callable[..., Any]:
        return dispatch.kernel_function(kernel, cfg)

    report = run_tuner(
        tuner,
        make_fn,
        t_args,
        t_kwargs,
        candidates,
        reference_cfg=heuristic,
        backward=False,
        name=f"{inv.op_id_v}({inv.signature})",
    )
    if report.best is None:
        raise ExceptionGroup(
            f"autotuning {inv.op_id_v}({inv.signature}): {report.describe_failures()}",
            [RuntimeError(f"{c.cfg}: {c.status}: {c.error}") for c in report.failures],
        )
    return report.best
