"""Tuning a whole function in one call: `kt.autotune(f, *args, **kwargs)`.

`f` is traced and lowered once with every kerneltune call recorded and resolved by the
heuristic (nothing is benchmarked while tracing), then every kerneltune call found in
the lowered program — forward and backward kernels alike — is tuned, and the result is
returned. The tuned configs land in the selector's caches, so `f` (jitted or not,
traced before or not) uses them on its next call.
"""

from __future__ import annotations

from typing import Any

import jax

from kerneltune._src import offline, recording
from kerneltune._src.result import AutotuningResult
from kerneltune._src.selection import ConfigSelectorChain, policy_override
from kerneltune._src.tuning.tuner import split_static


def autotune_function(
    f: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    selector: Any = None,
    tuner: Any = None,
    force: bool = False,
    progress: bool | None = None,
) -> AutotuningResult:
    """Tunes every kerneltune call `f(*args, **kwargs)` makes.

    Args:
      f: any JAX-traceable function (e.g. a train step or `jax.value_and_grad(loss)`).
      args, kwargs: its arguments: arrays or `jax.ShapeDtypeStruct`s (only shapes and
        dtypes matter: tuning runs on random data); other leaves are static.
      selector: the `ConfigSelectorChain` or `Executor` whose caches receive the
        configs (default: the default executor's).
      tuner: a tuner to benchmark with instead of the selector's own.
      force: benchmark again even when a tuned config is already cached.
      progress: show a progress bar (default: only on a terminal).

    Returns:
      An `AutotuningResult` with one entry per kerneltune call in `f`.
    """
    if not callable(f):
        raise TypeError(f"autotune needs a Kernel or a function, got {type(f).__qualname__}.")
    chain = offline._as_chain(selector)
    if tuner is not None:
        chain = ConfigSelectorChain(
            chain.cache,
            policy=chain.policy,
            tuner=tuner,
            persistent=chain.persistent,
            persist_autotune=chain.persist_autotune,
            on_event=chain.on_event,
        )
    arrays, rebuild = split_static(args, kwargs)

    def call(*leaves: Any) -> Any:
        a, k = rebuild(leaves)
        return f(*a, **k)

    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in arrays]
    # Trace once: record every call, benchmark none of them yet.
    with (
        recording.record_calls(),
        policy_override(None, allow_autotune=False, cache_miss_fallback="heuristics"),
    ):
        lowered = jax.jit(call).lower(*specs)
        records = recording.get_invocations()
    return offline.autotune_lowered(
        chain, lowered, invocations=records, force=force, progress=progress
    )
