"""The one place kerneltune reaches into JAX's private modules.

Each access is wrapped in a function that says what it needs, with a fallback where
JAX moved the name, so a JAX release that reorganises its internals breaks this module
alone (and its tests), not the layers above.
"""

from __future__ import annotations

import functools
from typing import Any

import jax


def array_impl_type() -> type:
    """The class of a concrete `jax.Array` (`ArrayImpl`), found without creating an
    array: creating one would start a backend, and importing kerneltune must not."""
    try:
        from jax._src.array import ArrayImpl
    except ImportError:  # moved: fall back on a real array, at first use only
        import jax.numpy as jnp

        return type(jnp.zeros(()))
    return ArrayImpl


#: JAX's predicate where it has one (0.12.1 deprecates the class it replaces).
_single_device_predicate = getattr(jax.sharding, "is_single_device_sharding", None)


def is_single_device_sharding(sharding: Any) -> bool:
    """True when `sharding` places an array on one device. JAX 0.12.1 deprecates the
    class `jax.sharding.SingleDeviceSharding` in favour of a predicate; older JAX has
    only the class."""
    if _single_device_predicate is not None:
        return bool(_single_device_predicate(sharding))
    return isinstance(sharding, jax.sharding.SingleDeviceSharding)


def varying_axes(x: Any) -> frozenset[str]:
    """The mesh axes along which `x` differs from device to device inside `shard_map`
    (none outside it): its type's `mat.varying` from JAX 0.10, `vma` before."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)
    names = getattr(mat, "varying", None) if mat is not None else getattr(aval, "vma", None)
    return frozenset(names or ())


def backends_initialized() -> bool:
    """True when this process has started a JAX backend (used by tests and by the
    parent of `kerneltune tune --workers`, which must not hold a GPU)."""
    from jax._src import xla_bridge

    backends: Any = getattr(xla_bridge, "_backends", None)
    return bool(backends)


def outside_any_trace() -> bool:
    """True where no JAX trace is under way (an eager call, its arguments and the
    constants it closes over all concrete); False inside `jit`, `grad`, `vmap`... and
    where this JAX does not say (the callers then do what they do under a trace)."""
    clean = _trace_state_clean()
    return bool(clean()) if clean is not None else False


@functools.cache
def _trace_state_clean() -> Any:
    """JAX's `trace_state_clean`, looked up once (eager calls ask on every call)."""
    from jax._src import core

    return getattr(core, "trace_state_clean", None)


def eval_context() -> Any:
    """JAX's context in which operations run eagerly even under a trace (not
    `ensure_compile_time_eval`, which also forces constants inside kernels)."""
    import jax

    make = getattr(jax.core, "eval_context", None)
    if make is None:  # pragma: no cover - moved in some JAX version
        from jax._src import core

        make = core.eval_context
    return make()


def distributed_client() -> Any:
    """The key-value store client `jax.distributed.initialize` made, or None (the same
    place orbax and multihost_utils read it from)."""
    try:
        from jax._src import distributed as jax_distributed
    except ImportError:  # pragma: no cover - moved in some JAX version
        return None
    state = getattr(jax_distributed, "global_state", None)
    return getattr(state, "client", None)


def profiler_module() -> Any:
    """JAX's private profiler module (its trace state and the functions a trace is
    started with), or None where it moved."""
    try:
        from jax._src import profiler
    except Exception:
        return None
    return profiler


def profiler_trace_active() -> bool | None:
    """Whether a JAX profiler trace runs now, however it was started
    (`jax.profiler.trace`, `start_trace`, a `ProfileSession`); None where JAX's
    private layout is not one this function knows (the caller then relies on what it
    observed itself).

    JAX 0.10 and 0.11 keep the running trace in `_profile_state.profile_session`;
    0.12 keeps the running `ProfileSession` in `_profile_state.session`."""
    state = getattr(profiler_module(), "_profile_state", None)
    for name in ("session", "profile_session"):
        if state is not None and hasattr(state, name):
            return getattr(state, name) is not None
    return None


def profiler_server_running() -> bool | None:
    """Whether `jax.profiler.start_server` started a server that still runs; None where
    JAX's private layout is not one this function knows."""
    module = profiler_module()
    if module is None or not hasattr(module, "_profiler_server"):
        return None
    return module._profiler_server is not None


def profiler_entry_points() -> list[tuple[Any, str]]:
    """Every (owner, attribute name) through which a JAX profiler trace or server is
    started: the module functions `start_trace` and `start_server` and, on JAX 0.12
    and newer (where `jax.profiler.trace` no longer goes through `start_trace`),
    `ProfileSession.start`. Empty where the private module moved."""
    module = profiler_module()
    if module is None:
        return []
    points: list[tuple[Any, str]] = [
        (module, name) for name in ("start_trace", "start_server") if hasattr(module, name)
    ]
    session = getattr(module, "ProfileSession", None)
    if isinstance(session, type) and callable(getattr(session, "start", None)):
        points.append((session, "start"))
    return points


def function_inside_jit(obj: Any) -> Any:
    """The Python function a `jax.jit` object wraps, or None. A jitted function keeps it
    as `_fun` (private) or `__wrapped__`; a deep copy of one (`copy.deepcopy(jax.nn.silu)`)
    keeps neither, only its private `_cache_miss` closure, which holds it as `fun`."""
    for name in ("__wrapped__", "_fun"):
        inner = getattr(obj, name, None)
        if callable(inner) and hasattr(inner, "__qualname__"):
            return inner
    seen, todo = set(), [getattr(obj, "_cache_miss", None)]
    while todo:
        fn = todo.pop()
        code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is None or not cells or id(fn) in seen:
            continue
        seen.add(id(fn))
        for var, cell in zip(code.co_freevars, cells):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if var != "fun" or not callable(value):
                continue
            if "<locals>" in getattr(value, "__qualname__", "<locals>"):
                todo.append(value)  # one of JAX's own closures: look inside it
            else:
                return value
    return None


def set_user_context_global(context: Any, value: Any) -> None:
    """Sets the process-wide value of a `jax.make_user_context` context. JAX 0.10.0's
    context object lacks `set_global` (0.10.2 has it); the config object inside it has
    it in both."""
    setter = getattr(context, "set_global", None)
    if setter is None:
        setter = context._obj.set_global
    setter(value)


def differentiation_tracer_types() -> tuple[type, ...]:
    """The tracer classes that carry tangents: JAX's JVP and linearize traces (what
    `jax.grad`, `jax.vjp`, `jax.jvp` and `jax.linearize` wrap a function's inputs in)."""
    from jax._src.interpreters import ad

    names = ("JVPTracer", "LinearizeTracer")
    return tuple(t for t in (getattr(ad, n, None) for n in names) if isinstance(t, type))


#: The modules each Pallas lowering kerneltune uses lives in (JAX 0.10 to 0.12).
_PALLAS_LOWERINGS = {
    "triton": "jax._src.pallas.triton.pallas_call_registration",
    "mosaic_gpu": "jax._src.pallas.mosaic_gpu.pallas_call_registration",
}
_lowering_missing: dict[str, str | None] = {}


def pallas_lowering_missing(lowering: str) -> str | None:
    """Why this JAX cannot lower a Pallas kernel with `lowering` ("triton" or
    "mosaic_gpu"), or None when it can. JAX 0.12 deprecates the Triton lowering; a
    release that removes it makes every Triton candidate unusable, with this reason."""
    if lowering not in _lowering_missing:
        import importlib.util

        import jax

        module = _PALLAS_LOWERINGS[lowering]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        _lowering_missing[lowering] = (
            None
            if found
            else f"JAX {jax.__version__} has no Pallas {lowering} lowering ({module} is gone)"
        )
    return _lowering_missing[lowering]


#: The start of the warning JAX (0.11 and later) gives on every Pallas Triton lowering.
TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"
_TRITON_NOTICE = (
    "JAX deprecates Pallas's Triton lowering, which kerneltune's Triton kernels use; "
    "JAX's own warning is silenced after this notice. Where a JAX release has removed "
    "it, those candidates are pruned with that reason and every op still runs."
)
_triton_notice_shown = False


def show_triton_deprecation_once() -> None:
    """Says once per process, in kerneltune's log, that JAX deprecates the Pallas
    Triton lowering, and keeps JAX's own warning (given on every lowering, and shown
    again each time any code enters `warnings.catch_warnings`) out of the user's log.
    Called before each Triton kernel is traced: a filter a caller's
    `catch_warnings` dropped is put back."""
    import logging
    import warnings

    global _triton_notice_shown
    if not _triton_notice_shown:
        _triton_notice_shown = True
        logging.getLogger("kerneltune").warning(_TRITON_NOTICE)
    for action, message, *_ in warnings.filters:
        if action == "ignore" and getattr(message, "pattern", None) == TRITON_DEPRECATION:
            return
    warnings.filterwarnings("ignore", message=TRITON_DEPRECATION)


@functools.cache
def mosaic_gpu_interpret_params() -> Any:
    """Params that run a Mosaic GPU kernel (`plgpu.kernel(..., interpret=...)`) in JAX's
    Mosaic GPU interpreter on any device, or None where this JAX has none: public as
    `plgpu.InterpretGPUParams` from JAX 0.12, private before. JAX 0.10.0's interpreter
    fails every TMA copy ("src must be a reference"); 0.10.2's runs them, so releases
    before 0.10.2 count as having none."""
    if tuple(jax.__version_info__[:3]) < (0, 10, 2):
        return None
    try:
        from jax.experimental.pallas import mosaic_gpu as plgpu
    except Exception:  # an experimental module: any error means no interpreter
        return None
    params = getattr(plgpu, "InterpretGPUParams", None)
    if params is None:
        try:
            from jax._src.pallas.mosaic_gpu.interpret import params as private
        except Exception:
            return None
        params = getattr(private, "InterpretGPUParams", None)
    return None if params is None else params()
