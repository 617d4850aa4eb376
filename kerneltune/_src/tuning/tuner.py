"""The Tuner: compiles candidate configs, times them, and picks the fastest.

One tuning goes:

1. the search strategy (`search.py`) asks the bench (`bench.py`) to compile, run once
   (validated) and time candidates, slowest to compile first, clearly slow ones
   dropping out early;
2. the best few are re-measured side by side (`winner.py`);
3. `decide` picks the winner from every candidate's samples. This is the seam for
   multi-process agreement: every process must pick the same winner, so a distributed
   `decide` (e.g. one that combines the processes' medians) can replace the default,
   `fastest`, through `Tuner(decide=...)`;
4. the report, and the warnings owed to the caller, are made (`run_report.py`).

The programs timed (inputs made concrete, each config's lowering, the reference
implementation's output) come from `programs.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic

from kerneltune._src.core import keys, tracing
from kerneltune._src.core.kernel_types import Cfg
from kerneltune._src.tuning import (
    inputs,
    lowering_pool,
    programs,
    run_report,
    search,
    timing,
    warm_start,
    winner,
)
from kerneltune._src.tuning.bench import Bench
from kerneltune._src.tuning.candidate import describe
from kerneltune._src.tuning.compiling import default_workers
from kerneltune._src.tuning.progress import Progress
from kerneltune._src.tuning.report import TuningReport
from kerneltune._src.tuning.sampler import TimerSource
from kerneltune._src.tuning.settings import BenchSettings, check_int, check_tuner_arguments
from kerneltune._src.tuning.winner import NOISE_BAND as NOISE_BAND
from kerneltune._src.tuning.winner import Decide as Decide
from kerneltune._src.tuning.winner import fastest as fastest

logger = logging.getLogger("kerneltune")

MakeFn = Callable[[Any], Callable[..., Any]]


class NoCandidatesError(ValueError, RuntimeError):
    """Tuning was given no candidate configs. A ValueError (a bad argument) and a
    RuntimeError (what the original's `Tuner.autotune` raised), so either catch works."""


@dataclasses.dataclass(frozen=True, eq=False)
class Tuner(Generic[Cfg]):
    """Benchmarks candidate configs on the device and returns the fastest.

    `Tuner(warmup, iters)` may be given by position (the original's signature); every
    other argument by name. Immutable, and checked when made (a ValueError names the
    field out of range); `dataclasses.replace(tuner, iters=5)` makes a variant.

    Args:
      warmup: untimed runs per candidate before its samples (at least one always runs:
        its output is validated).
      iters: timed samples (interleaved rounds) per candidate; each sample averages as
        many calls as fit in `target_sample_s`.
      timer: "auto" (CUPTI device time on a CUDA GPU when it is safe, else the wall
        clock), "cupti", "wallclock", or a `timing.Timer`.
      strategy: "auto", "exhaustive", "coordinate", "halving" or a
        `search.SearchStrategy`; "auto" starts from the winners at neighbouring shapes
        when there are any (a warm start), else is exhaustive for spaces of at most 128
        candidates that fit `max_evals` and coordinate descent otherwise.
      max_evals: at most this many candidates are compiled and timed.
      time_budget_s: no candidate starts building after this many seconds: those
        still waiting for a build thread then are given up (status "pruned"); those
        building are finished and timed (see `abandon_late`).
      abandon_late: at `time_budget_s`, also give up the candidates that have not run
        yet (status "pruned"), so that the budget bounds building them too (a build
        cannot be stopped: its thread runs on, its result unused); the first candidate
        given is waited for `first_grace_s` longer before it is given up.
      first_grace_s: with `abandon_late`, how much longer than `time_budget_s` the
        first candidate is waited for (default: as long again, `time_budget_s`).
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
      rtol: tolerance for validation: one number (>= 0) for every float dtype or a
        mapping from dtype to number (see `validate.DEFAULT_RTOL`).
      validate: compare every candidate's output with the reference config's.
      progress: show a progress bar (None: only on a terminal).
      decide: picks the winner from every candidate's result (default: `fastest`);
        the hook for multi-process agreement.
      seed: for the round order and randomised searches.
      rotate_bytes: input copies are made until cycling through them touches this many
        bytes (default: 128 MiB on GPU, 0 on CPU); 0 turns rotation off.
      drop_factor: after each timing round, a candidate whose fastest sample is this
        many times (more than 1) the best median gets no more samples (default: 1.5 with CUPTI, 2
        with the wall clock).
    """

    warmup: int = 1
    iters: int = 3
    _: dataclasses.KW_ONLY  # `Tuner(1, 3)` as the seed's signature allows; the rest by name
    timer: str | timing.Timer = "auto"
    strategy: str | search.SearchStrategy = "auto"
    max_evals: int | None = None
    time_budget_s: float | None = None
    abandon_late: bool = False
    first_grace_s: float | None = None
    compile_timeout_s: float | None = 300.0
    run_timeout_s: float | None = None
    max_workers: int | None = None
    target_sample_s: float | None = None
    top_k: int = 3
    remeasure_iters: int | None = None
    rtol: float | Mapping[Any, float] | None = None
    validate: bool = True
    progress: bool | None = None
    decide: Decide | None = None
    seed: int = 0
    rotate_bytes: int | None = None
    drop_factor: float | None = None

    def __post_init__(self) -> None:
        check_tuner_arguments({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        timing.install_profiler_observer()

    # The seed's API -------------------------------------------------------------------

    def measure(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        """Median seconds per call of `fn(*args, **kwargs)`, jitted, warm-up excluded.

        Raises:
          Exception: whatever compiling or running `fn` raised.
        """
        arrays, rebuild = programs.concrete_arrays(args, kwargs, seed=self.seed)
        with tracing.outside_traces():
            compiled = programs.lower_alone(programs.calling(fn, rebuild), arrays).compile()
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
                cand.compiled_as(compiled)
                bench.first_runs.run(cand)
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
        kwargs: dict[str, Any] | None,
        candidates: Iterable[Cfg],
    ) -> Cfg:
        """Returns the fastest of `candidates`; `make_fn(cfg)` builds the function to
        time, called as `fn(*args, **kwargs)`.

        Raises:
          NoCandidatesError: `candidates` is empty (a ValueError and a RuntimeError).
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
        kwargs: dict[str, Any] | None,
        candidates: Iterable[Cfg],
        *,
        reference_cfg: Cfg | None = None,
        backward: bool = False,
        name: str = "",
        reference_fn: Callable[..., Any] | None = None,
        hints: Sequence[Cfg] = (),
        compiles_at_once: int | None = None,
        log_summary: bool = True,
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
          hints: configs that won at neighbouring shapes of the same op, nearest first.
            With the "auto" strategy and a space of at least `WARM_MIN_SPACE`
            candidates, the search starts from them (`warm_start.strategy_for`).
          compiles_at_once: how many candidates compile in the wall time of one (None:
            `max_workers`). 1 where the process compiles its kernels one at a time
            (Mosaic GPU): a search then adds no configs to a batch for free.
          log_summary: log the report's one-line summary (INFO, logger "kerneltune");
            False where the caller logs it (the selection chain, once per key).

        Returns:
          A `TuningReport`; its `best` is None when every candidate failed (the caller
          falls back, e.g. to the heuristic, and can warn with
          `report.describe_failures()`).

        Raises:
          NoCandidatesError: `candidates` is empty (a ValueError and a RuntimeError).
          ValueError: `compiles_at_once` is not an integer >= 1 or None.
        """
        candidates = list(candidates)
        kwargs = {} if kwargs is None else kwargs  # `autotune(make_fn, args, None, ...)`
        if not candidates:
            raise NoCandidatesError(
                f"Tuner.tune got an empty candidate list for {name or 'a kernel'}."
            )
        check_int("compiles_at_once", compiles_at_once, 1, where="Tuner.tune", optional=True)
        start = time.perf_counter()
        arrays, rebuild = programs.concrete_arrays(args, kwargs, seed=self.seed)
        with tracing.outside_traces():
            # The chain's name already carries the op and its shapes.
            what = (
                name
                or f"kernel({keys.describe_abstract(keys.abstractify((tuple(args), dict(kwargs))))})"
            )
            strategy = warm_start.strategy_for(self.strategy, candidates, hints, self.max_evals)
            progress = Progress(what, self.progress)

            expected = None
            if reference_fn is not None:
                expected = programs.expected_output(reference_fn, rebuild, backward=backward)
            deadline = start + self.time_budget_s if self.time_budget_s is not None else None
            # Everything that is not needed to start compiling (choosing the timer, the
            # input copies, the all-zero check) happens while the first candidates compile.
            bench = self._bench(
                lowering_pool.lowering(
                    make_fn, rebuild, arrays, backward=backward, candidates=len(candidates)
                ),
                programs.compile_lowered,
                arrays,
                candidates,
                reference_cfg,
                lambda: timing.choose_timer(self.timer),
                progress,
                deadline,
                expected=expected,
                compiles_at_once=compiles_at_once,
            )
            zero_check = programs.Background(inputs.all_zero_floats, arrays)
            try:
                searched = time.perf_counter()
                strategy.search(bench)
                bench.first_runs.settle_by_majority()
                remeasure = self.remeasure_iters
                if remeasure is None:
                    remeasure = max(self.iters, 5)
                winner.remeasure_best(bench, self.top_k, remeasure)
                finished = time.perf_counter()
                results = bench.results()
                chosen = (self.decide or fastest)(results)
                best = candidates[chosen] if chosen is not None else None
                timer_name = bench.timer.name
                unvalidated = (
                    bench.first_runs.why_not_validated() if reference_cfg is not None else ""
                )
            finally:
                bench.close()
            run_report.warn_if_unvalidated(what, unvalidated, best, progress)
            run_report.log_if_all_zero(what, zero_check.result())
            report = run_report.report_of(
                bench,
                results,
                best=best,
                timer=timer_name,
                reference_cfg=reference_cfg,
                strategy=strategy.name,
                what=what,
                stamps=run_report.Stamps(start, searched, finished),
            )
        if log_summary:
            logger.info("%s", report.summary())
        return report

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
        compiles_at_once: int | None = None,
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
            abandon_late=self.abandon_late,
            first_grace_s=self._first_grace_s(),
            compiles_at_once=compiles_at_once,
        )
        return Bench(
            lower, finish, arg_sets, candidates, reference_cfg, timer, settings, progress,
            expected=expected,
        )  # fmt: skip

    def _first_grace_s(self) -> float:
        if not self.abandon_late:
            return 0.0
        if self.first_grace_s is not None:
            return self.first_grace_s
        return self.time_budget_s or 0.0


__all__ = ["Decide", "MakeFn", "NoCandidatesError", "Tuner", "describe", "fastest"]
