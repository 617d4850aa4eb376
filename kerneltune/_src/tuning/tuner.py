"""The Tuner: compiles candidate configs, times them, and picks the fastest."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic

import jax

from kerneltune._src import keys
from kerneltune._src.kernel_types import Cfg
from kerneltune._src.tuning.report import CandidateResult, TuningReport

logger = logging.getLogger("kerneltune")

MakeFn = Callable[[Any], Callable[..., Any]]


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


class Tuner(Generic[Cfg]):
    """Benchmarks candidate configs on the device and returns the fastest.

    Each candidate is compiled once (ahead of timing), run `warmup` times untimed, then
    timed `iters` times; its time is the median sample. A candidate that fails to
    compile or run is recorded with its error and skipped.

    Args:
      warmup: untimed runs per candidate before its samples.
      iters: timed samples per candidate.
    """

    def __init__(self, warmup: int = 1, iters: int = 3) -> None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"Tuner(warmup=...) must be an integer >= 0, got {warmup!r}.")
        if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
            raise ValueError(f"Tuner(iters=...) must be an integer >= 1, got {iters!r}.")
        self.warmup = warmup
        self.iters = iters

    # The seed's API -------------------------------------------------------------------

    def measure(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        """Median seconds per call of `fn(*args, **kwargs)`, jitted, warm-up excluded."""
        arrays, rebuild = split_static(args, kwargs)

        def call(*a: Any) -> Any:
            aa, kk = rebuild(a)
            return fn(*aa, **kk)

        compiled = jax.jit(call).lower(*arrays).compile()
        return statistics.median(self._samples(compiled, arrays))

    def autotune(
        self, make_fn: MakeFn, args: Sequence[Any], kwargs: dict[str, Any], candidates: Iterable[Cfg]
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
                "every candidate config failed",
                [RuntimeError(f"{c.cfg}: {c.error}") for c in report.candidates],
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
    ) -> TuningReport:
        """Times every candidate and reports all of them.

        Args:
          make_fn: builds the function to time for one config.
          args, kwargs: concrete inputs; array leaves are passed to the compiled
            function, other leaves are constants.
          candidates: the configs to try.
          reference_cfg: the heuristic config, reported alongside the winner.
          backward: time forward + backward (a scalar loss of the output
            differentiated with respect to the floating-point inputs).
          name: what is being tuned, for logs.
        """
        candidates = list(candidates)
        if not candidates:
            raise ValueError(f"Tuner.tune got an empty candidate list for {name or 'a kernel'}.")
        start = time.perf_counter()
        arrays, rebuild = split_static(args, kwargs)
        results = [self._time_one(make_fn, cfg, arrays, rebuild, backward) for cfg in candidates]
        ok = [r for r in results if r.ok]
        best = min(ok, key=lambda r: r.time_s).cfg if ok else None  # type: ignore[arg-type, return-value]
        heuristic_time = next(
            (r.time_s for r in results if r.ok and reference_cfg is not None and r.cfg == reference_cfg),
            None,
        )
        return TuningReport(
            best=best,
            candidates=tuple(results),
            timer="wallclock",
            heuristic_cfg=reference_cfg,
            heuristic_time_s=heuristic_time,
            wall_s=time.perf_counter() - start,
        )

    def _time_one(self, make_fn: MakeFn, cfg: Any, arrays: list[Any], rebuild: Any, backward: bool) -> CandidateResult:
        t0 = time.perf_counter()
        try:
            fn = make_fn(cfg)

            def call(*a: Any) -> Any:
                aa, kk = rebuild(a)
                return fn(*aa, **kk)

            target = _with_backward(call) if backward else call
            compiled = jax.jit(target).lower(*arrays).compile()
        except Exception as e:  # noqa: BLE001 - a failing candidate is data, not a crash.
            return CandidateResult(cfg=cfg, status="compile_error", error=_describe(e))
        compile_s = time.perf_counter() - t0
        try:
            samples = self._samples(compiled, arrays)
        except Exception as e:  # noqa: BLE001
            return CandidateResult(cfg=cfg, status="run_error", error=_describe(e), compile_s=compile_s)
        return CandidateResult(
            cfg=cfg,
            time_s=statistics.median(samples),
            samples_s=tuple(samples),
            compile_s=compile_s,
        )

    def _samples(self, compiled: Any, arrays: list[Any]) -> list[float]:
        for _ in range(self.warmup):
            jax.block_until_ready(compiled(*arrays))
        samples = []
        for _ in range(self.iters):
            t = time.perf_counter()
            jax.block_until_ready(compiled(*arrays))
            samples.append(time.perf_counter() - t)
        return samples


def _with_backward(call: Callable[..., Any]) -> Callable[..., Any]:
    """Forward + backward: the gradient of a scalar loss of the output with respect
    to every floating-point input."""
    import jax.numpy as jnp

    def loss_and_grads(*arrays: Any) -> Any:
        float_positions = [i for i, a in enumerate(arrays) if jnp.issubdtype(a.dtype, jnp.inexact)]

        def loss(*float_arrays: Any) -> Any:
            full = list(arrays)
            for i, a in zip(float_positions, float_arrays, strict=True):
                full[i] = a
            out = call(*full)
            return sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree_util.tree_leaves(out))

        return jax.grad(loss, argnums=tuple(range(len(float_positions))))(
            *[arrays[i] for i in float_positions]
        )

    return loss_and_grads


def _describe(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return first[:300]
