"""The kernel's hooks as selection calls them: its heuristic, its candidates (and why
there may be nothing to tune), its config type, and the inputs to tune on. Each is read
from the kernel's method record (`methods.methods_of`), in the call's context."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from kerneltune._src.kernel import dispatch
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import Invocation, Kernel, key_builder_of
from kerneltune._src.kernel.methods import bound, methods_of


def as_keyed_by(inv: Invocation[Any, Any], kernel: Kernel[Any, Any]) -> Invocation[Any, Any]:
    """`inv` keyed as the executor keys it: with the kernel's version and key builder
    (an Invocation built by hand may carry neither)."""
    version = str(kernel.version)
    builder = inv.key_builder or key_builder_of(kernel)
    if inv.version == version and inv.key_builder is builder:
        return inv
    return dataclasses.replace(inv, version=version, key_builder=builder)


def find_heuristic(kernel: Kernel[Any, Any], inv: Invocation[Any, Any]) -> Any:
    hook = bound(kernel, methods_of(kernel, context_of(inv)).heuristic_cfg)
    return None if hook is None else hook(inv)


def no_heuristic_reason(kernel: Kernel[Any, Any], inv: Invocation[Any, Any]) -> str:
    """Why `find_heuristic` gave no config for this call."""
    hook = methods_of(kernel, context_of(inv)).heuristic_cfg
    if hook is None:
        return "the kernel defines no heuristic_cfg on this platform"
    return f"{type(kernel).__name__}.{hook.__name__} returned None for this call"


def tunable_candidates(
    kernel: Kernel[Any, Any], inv: Invocation[Any, Any]
) -> tuple[list[Any], str]:
    """The candidates to tune for this call, and why there is nothing to tune ("" when
    there is): no candidate hook on this platform, an empty list for these arguments,
    or only the heuristic. The kernel's hook is called once."""
    hook = bound(kernel, methods_of(kernel, context_of(inv)).candidates)
    if hook is None:
        return [], "the kernel defines no candidate_cfgs/config_space on this platform"
    candidates = list(hook(inv))
    if not candidates and isinstance(kernel, BackendKernel) and not kernel.runs_pallas():
        return [], "only plain-JAX backends run on this platform (no Pallas)"
    if not candidates:
        return [], f"{type(kernel).__name__}.{hook.__name__} returned no candidates for this call"
    if all(c == candidates[0] for c in candidates) and candidates[0] == find_heuristic(kernel, inv):
        return candidates, "the only candidate is the heuristic config"
    return candidates, ""


def config_type_of(kernel: Kernel[Any, Any], inv: Invocation[Any, Any]) -> type | None:
    """The kernel's config type: `config_type`, else the type `heuristic_cfg` returns,
    else (a kernel with candidates only) the one type of its candidates: without a
    type, a stored config would come back as a dict of fields."""
    found = methods_of(kernel, context_of(inv))
    if found.config_type is not None:
        return found.config_type
    heuristic = find_heuristic(kernel, inv)
    if heuristic is not None:
        return type(heuristic)
    hook = bound(kernel, found.candidates)
    types = {type(c) for c in hook(inv)} if hook is not None else set()
    return types.pop() if len(types) == 1 else None


def check_config_type(
    kernel: Kernel[Any, Any], inv: Invocation[Any, Any], cfg: Any, what: str
) -> None:
    expected = config_type_of(kernel, inv)
    if expected is not None and not isinstance(cfg, expected):
        raise TypeError(
            f"{what} for {kernel.op_id_v} must be a {expected.__qualname__}, got "
            f"{type(cfg).__qualname__} ({cfg!r})."
        )


def unusable_reason(kernel: Kernel[Any, Any], inv: Invocation[Any, Any], cfg: Any) -> str | None:
    """Why `cfg` cannot run `inv` in this process (say, it names a backend that is not
    installed here), from the kernel's optional `config_unusable(inv, cfg)` hook; None
    when it can run, or the kernel does not say."""
    hook = bound(kernel, methods_of(kernel, context_of(inv)).config_unusable)
    return None if hook is None else hook(inv, cfg)


def trace_failure(kernel: Kernel[Any, Any], inv: Invocation[Any, Any], cfg: Any) -> str | None:
    """Why the kernel fails to trace `inv` with `cfg` (say, a stored block of -1, or a
    config of a kernel whose code changed without a version bump), or None when it
    traces. Shapes only: nothing is compiled or run. A sharded call is not checked."""
    if context_of(inv) is not None:
        return None
    leaves, treedef = jax.tree_util.tree_flatten((tuple(inv.args), dict(inv.kwargs)))
    arrays = [i for i, x in enumerate(leaves) if hasattr(x, "shape") and hasattr(x, "dtype")]
    fn = dispatch.kernel_function(kernel, cfg)

    def call(*values: Any) -> Any:
        full = list(leaves)
        for i, v in zip(arrays, values, strict=True):
            full[i] = v
        args, kwargs = jax.tree_util.tree_unflatten(treedef, full)
        return fn(*args, **kwargs)

    specs = [jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype) for i in arrays]
    try:
        jax.eval_shape(call, *specs)
    except Exception as e:  # any failure: the config cannot serve this call
        text = f"{type(e).__name__}: {e}".strip().splitlines()
        return text[0][:300] if text else type(e).__name__
    return None


def concrete_inputs(
    kernel: Kernel[Any, Any], inv: Invocation[Any, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs to benchmark with: the call's own arrays when they are concrete, else
    `kernel.tuning_inputs(inv)` (the call is being traced, or replayed from a record)."""
    leaves = jax.tree_util.tree_leaves((inv.args, dict(inv.kwargs)))
    if any(isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct)) for x in leaves):
        hook = bound(kernel, methods_of(kernel, context_of(inv)).tuning_inputs)
        made = hook(inv) if hook is not None else kernel.tuning_inputs(inv)
        return tuple(made[0]), dict(made[1])
    return tuple(inv.args), dict(inv.kwargs)


def context_of(inv: Invocation[Any, Any]) -> str | None:
    return inv.method if inv.method == "shard_map" else None


def backward_tuned_apart(kernel: Kernel[Any, Any], cfg: Any) -> bool:
    """True when the backward of `cfg` is the same whatever the config (its backend's
    `backward_tuned_apart`): timing such a candidate with its backward adds the same
    time to every one of them."""
    if not isinstance(kernel, BackendKernel):
        return False
    backend = _backend_or_none(kernel, cfg)
    return (
        backend is not None and backend.backward_tuned_apart and not backend.differentiated_by_jax
    )


def runs_alone(kernel: Kernel[Any, Any], cfg: Any) -> bool:
    """True when `cfg` runs as a Pallas kernel compiled for the device (Triton or
    Mosaic GPU): one custom call that XLA fuses none of its neighbours' work into, so
    its time measured alone is its time inside a program. False for XLA's own code,
    libraries (cuDNN, tokamax: what they run is theirs to choose) and the interpreter."""
    if not isinstance(kernel, BackendKernel) or kernel.use_interpreter():
        return False
    backend = _backend_or_none(kernel, cfg)
    return backend is not None and backend.lowering is not None


def compiles_one_at_a_time(kernel: Kernel[Any, Any], cfg: Any) -> bool:
    """True when `cfg` runs a Mosaic GPU kernel on the device. jaxlib compiles Mosaic
    GPU kernels under one process-wide lock (`CachedCompile` in its custom call), so
    such candidates compile one after another whatever the compile threads: a batch
    of N costs N compiles, not one."""
    if not isinstance(kernel, BackendKernel) or kernel.use_interpreter():
        return False
    backend = _backend_or_none(kernel, cfg)
    return backend is not None and backend.lowering == "mosaic_gpu"


def _backend_or_none(kernel: BackendKernel[Any], cfg: Any) -> Any:
    """The backend that runs `cfg`, or None for a config that names none of the
    kernel's backends (such a config is treated as the general case)."""
    try:
        return kernel.backend_of(cfg)
    except (AttributeError, ValueError):
        return None
