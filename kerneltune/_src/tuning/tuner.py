"""The Tuner: compiles candidate configs, times them, and picks the fastest.

One tuning goes:

1. the search strategy asks the bench to evaluate candidates (`bench.py`): one thread
   traces and lowers them (Python, which holds the GIL), slowest to compile first, and
   hands them to parallel compile threads (with a timeout); each runs once as soon as
   it is compiled (a warm-up whose output is validated against the reference config's)
   and is timed in interleaved rounds on rotating input buffers (with a device timer,
   while the others still compile); clearly slow candidates drop out early. Choosing
   the timer, copying the inputs and checking them for zeros overlap the first compiles;
2. the best few are re-measured side by side;
3. `decide` picks the winner from every candidate's samples. This is the seam for
   multi-process agreement: every process must pick the same winner, so a distributed
   `decide` (e.g. one that combines the processes' medians) can replace the default,
   `fastest`, through `Tuner(decide=...)`.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic

import jax
import jax.numpy as jnp

from kerneltune._src import keys, tracing
from kerneltune._src.kernel_types import Cfg
from kerneltune._src.tuning import compiling, inputs, search, timing
from kerneltune._src.tuning.bench import Bench
from kerneltune._src.tuning.candidate import Candidate, describe
from kerneltune._src.tuning.compiling import default_workers
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.report import CandidateResult, TuningReport
from kerneltune._src.tuning.sampler import TimerSource
from kerneltune._src.tuning.settings import BenchSettings

logger = logging.getLogger("kerneltune")

MakeFn = Callable[[Any], Callable[..., Any]]
#: Picks the winner's index from every candidate's result (None: no winner).
Decide = Callable[[Sequence[CandidateResult]], "int | None"]


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


#: Medians closer than this fraction are a tie: run-to-run noise on a GPU is about 1%.
NOISE_BAND = 0.02


def fastest(results: Sequence[CandidateResult]) -> int | None:
    """The default `decide`: the candidate with the lowest median time, where times
    within `NOISE_BAND` of the lowest count as a tie that goes to the earliest candidate.

    The selection chain puts the kernel's heuristic config first, so tuning replaces
    the heuristic only with a config measurably faster than it; other ties go to the
    candidates' order, so the choice is deterministic.
    """
    ok = [(i, r.time_s) for i, r in enumerate(results) if r.ok and r.time_s is not None]
    if not ok:
        return None
    lowest = min(t for _, t in ok)
    return next(i for i, t in ok if t <= lowest * (1.0 + NOISE_BAND))


class Tuner(Generic[Cfg]):
    """Benchmarks candidate configs on the device and returns the fastest.

    Args:
      warmup: untimed runs per candidate before its samples (at least one always runs:
        its output is validated).
      iters: timed samples (interleaved rounds) per candidate; each sample averages as
        many calls as fit in `target_sample_s`.
      timer: "auto" (CUPTI device time on a CUDA GPU when it is safe, else the wall
        clock), "cupti", "wallclock", or a `timing.Timer`.
      strategy: "auto", "exhaustive", "coordinate", "halving" or a
        `search.SearchStrategy`; "auto" is exhaustive for spaces of at most 128
        candidates that fit `max_evals`, coordinate descent otherwise.
      max_evals: at most this many candidates are compiled and timed.
      time_budget_s: no new candidate is started after this many seconds.
      compile_timeout_s: a candidate still compiling after this long is abandoned
        (status "timeout"); None waits forever.
      run_timeout_s: a candidate whose first run takes longer is abandoned (status
        "timeout"; the run goes on in its thread, which in-process tuning cannot stop:
        isolated workers can). Default: 100 times the heuristic config's first run, at
        least 10 s, and 60 s before the heuristic ran; `math.inf` never abandons.
      max_workers: compile threads (default: the usable cores, at most 32); one more
        thread traces and lowers candidates for them, slowest to compile first.
      target_sample_s: how long one sample should take (default: 1 ms of device time
        with CUPTI, 2 ms with the wall clock).
      top_k: how many of the best candidates are re-measured side by side.
      remeasure_iters: samples per candidate in that re-measurement (default:
        `max(iters, 5)`).
      rtol: tolerance for validation: one number for every float dtype or a mapping
        from dtype to number (see `validate.DEFAULT_RTOL`).
      validate: compare every candidate's output with the reference config's.
      progress: show a progress bar (None: only on a terminal).
      decide: picks the winner from every candidate's result (default: `fastest`);
        the hook for multi-process agreement.
      seed: for the round order and randomised searches.
      rotate_bytes: input copies are made until cycling through them touches this many
        bytes (default: 128 MiB on GPU, 0 on CPU); 0 turns rotation off.
      drop_factor: after each timing round, a candidate whose fastest sample is this
        many times the best median gets no more samples (default: 1.5 with CUPTI, 2
        with the wall clock).
    """

    def __init__(
        self,
        warmup: int = 1,
        iters: int = 3,
        *,
        timer: str | timing.Timer = "auto",
        strategy: str | search.SearchStrategy = "auto",
        max_evals: int | None = None,
        time_budget_s: float | None = None,
        compile_timeout_s: float | None = 300.0,
        run_timeout_s: float | None = None,
        max_workers: int | None = None,
        target_sample_s: float | None = None,
        top_k: int = 3,
        remeasure_iters: int | None = None,
        rtol: float | Mapping[Any, float] | None = None,
        validate: bool = True,
        progress: bool | None = None,
        decide: Decide | None = None,
        seed: int = 0,
        rotate_bytes: int | None = None,
        drop_factor: float | None = None,
    ) -> None:
        _check_int("warmup", warmup, 0)
        _check_int("iters", iters, 1)
        _check_int("top_k", top_k, 0)
        if max_evals is not None:
            _check_int("max_evals", max_evals, 1)
        if remeasure_iters is not None:
            _check_int("remeasure_iters", remeasure_iters, 0)
        if max_workers is not None:
            _check_int("max_workers", max_workers, 1)
        for name, value in (
            ("time_budget_s", time_budget_s),
            ("compile_timeout_s", compile_timeout_s),
            ("run_timeout_s", run_timeout_s),
            ("target_sample_s", target_sample_s),
            ("drop_factor", drop_factor),
        ):
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(
                    f"Tuner({name}=...) must be a positive number or None, got {value!r}."
                )
        if isinstance(strategy, str) and strategy not in search.STRATEGIES:
            raise ValueError(
                f"Tuner(strategy=...) must be one of {search.STRATEGIES} or a SearchStrategy, "
                f"got {strategy!r}."
            )
        timing.choose_timer(timer) if isinstance(timer, str) and timer == "wallclock" else None
        if isinstance(timer, str) and timer not in ("auto", "cupti", "wallclock"):
            raise ValueError(
                f"Tuner(timer=...) must be 'auto', 'cupti', 'wallclock' or a Timer, got {timer!r}."
            )
        timing.install_profiler_observer()
        self.warmup = warmup
        self.iters = iters
        self.timer = timer
        self.strategy = strategy
        self.max_evals = max_evals
        self.time_budget_s = time_budget_s
        self.compile_timeout_s = compile_timeout_s
        self.run_timeout_s = run_timeout_s
        self.max_workers = max_workers
        self.target_sample_s = target_sample_s
        self.top_k = top_k
        self.remeasure_iters = max(iters, 5) if remeasure_iters is None else remeasure_iters
        self.rtol = rtol
        self.validate = validate
        self.progress = progress
        self.decide: Decide = decide or fastest
        self.seed = seed
        self.rotate_bytes = rotate_bytes
        self.drop_factor = drop_factor

    # The seed's API -------------------------------------------------------------------

    def measure(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        """Median seconds per call of `fn(*args, **kwargs)`, jitted, warm-up excluded.

        Raises:
          Exception: whatever compiling or running `fn` raised.
        """
        # Inputs are made outside any trace the caller is in; compiling must not run
        # under ensure_compile_time_eval, which breaks Pallas kernel bodies that build
        # constants ("captures constants").
        with jax.ensure_compile_time_eval():
            arrays, rebuild = split_static(args, kwargs)
            arrays = inputs.concrete_inputs(arrays, seed=self.seed)
        with tracing.outside_traces():

            def call(*a: Any) -> Any:
                aa, kk = rebuild(a)
                return fn(*aa, **kk)

            compiled = jax.jit(call).lower(*arrays).compile()
            timer, _ = timing.choose_timer(self.timer)
            bench = self._bench(
                lambda _: compiled,
                None,
                arrays,
                [None],
                None,
                timer,
                Progress("", False),
                validate=False,
            )
            try:
                cand = bench.cands[0]
                cand.compiled, cand.status, cand.submitted = compiled, "ok", True
                bench.first_run(cand)
                if not cand.ok:
                    raise RuntimeError(f"running the function failed: {cand.error}")
                bench.sample([cand], self.iters)
                if not cand.ok:
                    raise RuntimeError(f"running the function failed: {cand.error}")
                return statistics.median(cand.samples)
            finally:
                bench.close()

    def autotune(
        self,
        make_fn: MakeFn,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        candidates: Iterable[Cfg],
    ) -> Cfg:
        """Returns the fastest of `candidates`; `make_fn(cfg)` builds the function to
        time, called as `fn(*args, **kwargs)`.

        Raises:
          ValueError: `candidates` is empty.
          ExceptionGroup: every candidate failed.
        """
        report = self.tune(make_fn, args, kwargs, candidates)
        if report.best is None:
            raise ExceptionGroup(
                f"every candidate config failed: {report.describe_failures()}",
                [RuntimeError(f"{c.cfg}: {c.status}: {c.error}") for c in report.failures],
            )
        return report.best

    # What the selection chain uses ----------------------------------------------------

    def tune(
        self,
        make_fn: MakeFn,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        candidates: Iterable[Cfg],
        *,
        reference_cfg: Cfg | None = None,
        backward: bool = False,
        name: str = "",
        reference_fn: Callable[..., Any] | None = None,
    ) -> TuningReport:
        """Evaluates candidates (all of them, or those the search strategy picks) and
        reports every one.

        Args:
          make_fn: builds the function to time for one config.
          args: the positional inputs; array leaves are passed to the compiled
            function, other leaves are constants. `ShapeDtypeStruct` leaves are
            replaced by random data.
          kwargs: the keyword inputs, treated as `args` are.
          candidates: the configs to try.
          reference_cfg: the heuristic config: every candidate's output is validated
            against its output, and the winner's speedup is reported against its time
            (it is evaluated even when it is not a candidate, but only a candidate can
            win).
          backward: time forward + backward (the gradient of the sum of the
            floating-point outputs with respect to the floating-point inputs).
          name: what is being tuned, for logs.
          reference_fn: the op's math in plain JAX, called as `make_fn(cfg)`'s functions
            are: when given, every candidate (the reference config too) is validated
            against its output instead of the reference config's, so a wrong or failing
            heuristic cannot turn validation off or upside down.

        Returns:
          A `TuningReport`; its `best` is None when every candidate failed (the caller
          falls back, e.g. to the heuristic, and can warn with
          `report.describe_failures()`).

        Raises:
          ValueError: `candidates` is empty.
        """
        candidates = list(candidates)
        if not candidates:
            raise ValueError(f"Tuner.tune got an empty candidate list for {name or 'a kernel'}.")
        start = time.perf_counter()
        with jax.ensure_compile_time_eval():
            arrays, rebuild = split_static(args, kwargs)
            arrays = inputs.concrete_inputs(arrays, seed=self.seed)
            # The chain's name already carries the op and its shapes.
            what = (
                name
                or f"kernel({keys.describe_abstract(keys.abstractify((tuple(args), dict(kwargs))))})"
            )
            strategy = search.resolve_strategy(self.strategy, len(candidates), self.max_evals)
            progress = Progress(what, self.progress)

            def lower(cfg: Any) -> Any:
                fn = make_fn(cfg)

                def call(*a: Any) -> Any:
                    aa, kk = rebuild(a)
                    return fn(*aa, **kk)

                target = _with_backward(call) if backward else call
                return jax.jit(target).lower(*arrays)

            expected = None
            if reference_fn is not None:

                def expected(sets: list[list[Any]]) -> Any:
                    def call(*a: Any) -> Any:
                        aa, kk = rebuild(a)
                        return reference_fn(*aa, **kk)

                    target = _with_backward(call) if backward else call
                    return jax.block_until_ready(jax.jit(target)(*sets[0]))

            deadline = start + self.time_budget_s if self.time_budget_s is not None else None
            # Everything that is not needed to start compiling (choosing the timer, the
            # input copies, the all-zero check) happens while the first candidates compile.
            bench = self._bench(
                lower,
                _compile,
                arrays,
                candidates,
                reference_cfg,
                lambda: timing.choose_timer(self.timer),
                progress,
                deadline,
                expected=expected,
            )
            zero_check = _Background(inputs.all_zero_floats, arrays)
            try:
                searched = time.perf_counter()
                strategy.search(bench)
                bench.settle_by_majority()
                self._remeasure_top(bench)
                finished = time.perf_counter()
                results = bench.results()
                winner = self.decide(results)
                best = candidates[winner] if winner is not None else None
                timer_name = bench.timer.name
                unvalidated = bench.why_not_validated() if reference_cfg is not None else ""
            finally:
                bench.close()
            if unvalidated and best is not None:
                warnings.warn(
                    f"{what}: the candidates' outputs were not validated: {unvalidated}; "
                    "the winner was chosen on time alone.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                progress.close()
            zeros = zero_check.result()
            if zeros:
                logger.warning(
                    "Tuning %s on all-zero float inputs (positions %s): timings on zeros can "
                    "flatter some configs; pass random data.",
                    what,
                    zeros,
                )
            end = time.perf_counter()
            report = TuningReport(
                best=best,
                candidates=results,
                timer=timer_name,
                heuristic_cfg=reference_cfg,
                heuristic_time_s=bench.reference_time(),
                wall_s=end - start,
                strategy=strategy.name,
                name=what,
                timer_note=bench.timer_note,
                validated=bench.validated,
                validated_by=bench.validated_by,
                phases_s={
                    "setup": searched - start,
                    **bench.phases,
                    "finish": end - finished,
                    "total": end - start,
                },
            )
        logger.info("%s", report.summary())
        return report

    # ---------------------------------------------------------------------------------

    def _bench(
        self,
        lower: Callable[[Any], Any],
        finish: Callable[[Any], Any] | None,
        arrays: list[Any],
        candidates: Sequence[Any],
        reference_cfg: Any,
        timer: TimerSource,
        progress: Progress,
        deadline: float | None = None,
        *,
        validate: bool = True,
        expected: Callable[[list[list[Any]]], Any] | None = None,
    ) -> Bench:
        rotate = self.rotate_bytes
        if rotate is None:
            rotate = 128 << 20 if timing.default_platform() in ("gpu", "cuda", "rocm") else 0

        def arg_sets() -> list[list[Any]]:
            return inputs.rotation_sets(arrays, min_bytes=rotate) if rotate else [list(arrays)]

        workers = self.max_workers or min(32, default_workers())
        settings = BenchSettings(
            warmup=self.warmup,
            rounds=self.iters,
            target_sample_s=self.target_sample_s,
            compile_timeout_s=self.compile_timeout_s,
            max_workers=max(1, min(workers, len(candidates) + 1)),
            max_evals=self.max_evals,
            deadline=deadline,
            rtol=self.rtol,
            validate=self.validate and validate,
            seed=self.seed,
            drop_factor=self.drop_factor,
            run_timeout_s=self.run_timeout_s,
        )
        return Bench(
            lower,
            finish,
            arg_sets,
            candidates,
            reference_cfg,
            timer,
            settings,
            progress,
            expected=expected,
        )

    def _remeasure_top(self, bench: Bench) -> None:
        """The best few, side by side, with more samples: a winner decided by a few
        samples taken at different times can be a lucky one."""
        # Judged slow on inflated samples? Then it competes with the best few again.
        back = bench.confirm_slow()
        if self.top_k < 2 or self.remeasure_iters < 1:
            return
        ranked = sorted((c for c in bench.cands if c.median is not None), key=_median)
        top: list[Candidate] = ranked[: self.top_k]
        top += [c for c in back if c not in top]
        if len(top) < 2:
            return
        ref = bench.reference
        if ref is not None and ref.ok and ref not in top:
            top.append(ref)  # its time is the baseline of the reported speedup
        bench.sample(top, self.remeasure_iters)


def _compile(lowered: Any) -> Any:
    return lowered.compile()


class _Background:
    """Runs `fn(*args)` on a daemon thread; `result()` waits for it (None if it
    raised: what it computes is advisory)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._result: Any = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        with compiling.exit_waits_for_this():  # it may compile: exit must wait
            try:
                self._result = fn(*args)
            except Exception as e:
                logger.debug("background check failed: %s", e)

    def result(self, timeout_s: float = 60.0) -> Any:
        self._thread.join(timeout_s)
        return self._result


def _median(c: Candidate) -> float:
    return c.median  # type: ignore[return-value]


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"Tuner({name}=...) must be an integer >= {minimum}, got {value!r}.")


def _with_backward(call: Callable[..., Any]) -> Callable[..., Any]:
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

        grads, out = jax.grad(loss, argnums=tuple(range(len(float_positions))), has_aux=True)(
            *[arrays[i] for i in float_positions]
        )
        return out, grads

    return forward_and_grads


__all__ = ["Decide", "MakeFn", "Tuner", "describe", "fastest", "split_static"]
