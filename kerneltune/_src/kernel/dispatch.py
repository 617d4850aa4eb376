"""Running a kernel with a config: the callable for the platform, with the kernel's
custom gradient wired in.

`kernel_function` builds the callable that runs a kernel with a fixed config from its
method record (`methods.methods_of`), with the kernel's custom VJP attached when it
defines one. The executor and the tuner both use `kernel_function`, so what is timed is
exactly what runs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import codec, jax_compat, keys, options, tracing
from kerneltune._src.kernel.base import Kernel
from kerneltune._src.kernel.methods import KernelMethods, bound, method_names, methods_of


def kernel_function(
    kernel: Kernel[Any, Any], cfg: Any, context: str | None = None
) -> Callable[..., Any]:
    """`f(*args, **kwargs)` running `kernel` with `cfg` on this platform, with the
    kernel's custom VJP when it defines one (non-array arguments such as `causal=True`
    are treated as constants and get no cotangent)."""
    found = methods_of(kernel, context)
    run = _require_run(kernel, found)
    native = bound(kernel, found.differentiated_by_jax)
    if native is not None and native(cfg):
        # The config picks an implementation JAX differentiates itself (e.g. a library
        # backend such as cuDNN or XLA): no custom VJP, so its own backward runs.
        return functools.partial(run, cfg=cfg)
    fwd = bound(kernel, found.fwd_with_residuals)
    bwd = bound(kernel, found.vjp)
    short = bound(kernel, found.custom_vjp)
    if (fwd is None) != (bwd is None):
        have, missing = (
            ("fwd_with_residuals", "vjp") if bwd is None else ("vjp", "fwd_with_residuals")
        )
        raise TypeError(
            f"kernel {kernel.op_id!r} defines {have} but not {missing}; define both (or "
            "neither, or the short form custom_vjp(primals, cfg, kwargs, cotangents))."
        )
    reference = bound(kernel, found.reference)
    if fwd is not None and bwd is not None:
        return _with_vjp(run, cfg, kernel.op_id, fwd=fwd, bwd=bwd, short=None, reference=reference)
    if short is not None:
        return _with_vjp(
            run, cfg, kernel.op_id, fwd=None, bwd=None, short=short, reference=reference
        )

    def plain(*args: Any, **kwargs: Any) -> Any:
        return run(*args, cfg=cfg, **kwargs)

    return plain


@dataclasses.dataclass(frozen=True)
class KernelFunction:
    """`kernel_function(kernel, cfg, context)` as a function of `cfg`: what a tuning
    builds its candidates from. A module-level object, so it pickles with its kernel,
    and a lowering worker process builds the same program (`tuning/lowering_pool.py`)."""

    kernel: Kernel[Any, Any]
    context: str | None = None

    def __call__(self, cfg: Any) -> Callable[..., Any]:
        return kernel_function(self.kernel, cfg, self.context)


def _require_run(kernel: Kernel[Any, Any], found: KernelMethods) -> Callable[..., Any]:
    run = bound(kernel, found.run)
    if run is None:
        tried = ", ".join(method_names("run", found.context, found.platform, found.device))
        forced = options.PLATFORM.value
        hint = (
            f" The platform {forced!r} was forced with {options.env_name('platform')}; "
            "unset it to run on the detected one."
            if forced is not None
            else ""
        )
        raise TypeError(
            f"kernel {kernel.op_id!r} ({type(kernel).__name__}) defines no run method for "
            f"this platform; looked for: {tried}. Define `run(self, *args, cfg, **kwargs)`." + hint
        )
    return run


def _with_vjp(
    run: Callable[..., Any],
    cfg: Any,
    op_id: str,
    *,
    fwd: Callable[..., Any] | None,
    bwd: Callable[..., Any] | None,
    short: Callable[..., Any] | None,
    reference: Callable[..., Any] | None,
) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        positions = [i for i, leaf in enumerate(leaves) if keys.is_array(leaf)]
        # The array leaves of the positional arguments come first among `dyn`; the
        # rest are keyword arguments', which the custom gradient gives no cotangent.
        positional = sum(keys.is_array(x) for x in jax.tree_util.tree_leaves(args))

        def rebuild(dyn: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
            full = list(leaves)
            for i, x in zip(positions, dyn, strict=True):
                full[i] = x
            a, k = jax.tree_util.tree_unflatten(treedef, full)
            return tuple(a), dict(k)

        @jax.custom_vjp
        def core(*dyn: Any) -> Any:
            a, k = rebuild(dyn)
            return run(*a, cfg=cfg, **k)

        def forward(*dyn: Any) -> Any:
            a, k = rebuild(dyn)
            if fwd is not None:
                return fwd(*a, cfg=cfg, **k)
            return run(*a, cfg=cfg, **k), None

        def backward(residuals: Any, out: Any, dyn: Any, dout: Any) -> tuple[Any, ...]:
            a, k = rebuild(dyn)
            if bwd is not None:
                cts = bwd(residuals, out, dout, *a, cfg=cfg, **k)
            else:
                assert short is not None
                cotangents = dout if isinstance(dout, tuple) else (dout,)
                cts = short(a, cfg, k, cotangents)
            return _dyn_cotangents(cts, a, dyn)

        def reference_of_dyn(*dyn: Any) -> Any:
            assert reference is not None
            a, k = rebuild(dyn)
            return reference(*a, **k)

        if reference is not None:
            forward_twice = _second_order_from_reference(forward, reference_of_dyn)
            backward_twice = _second_order_from_reference_vjp(backward, reference_of_dyn)
        else:
            forward_twice = _second_order_of_own_code(forward, op_id, cfg)
            backward_twice = _second_order_of_own_code(backward, op_id, cfg)

        def core_fwd(*primals: Any) -> Any:
            # With symbolic zeros, each input comes with whether it is differentiated.
            perturbed = [i for i, p in enumerate(primals) if i >= positional and p.perturbed]
            if perturbed and not tracing.keyword_cotangents_are_zero():
                raise _keyword_gradient_error(op_id, kwargs, leaves, positions, perturbed)
            dyn = tuple(p.value for p in primals)
            out, residuals = forward_twice(*dyn)
            return out, (residuals, out, dyn)

        def core_bwd(saved: Any, dout: Any) -> tuple[Any, ...]:
            residuals, out, dyn = saved
            return backward_twice(residuals, out, dyn, _instantiate_zeros(dout))

        core.defvjp(core_fwd, core_bwd, symbolic_zeros=True)
        return core(*(leaves[i] for i in positions))

    return call


def _keyword_gradient_error(
    op_id: str,
    kwargs: dict[str, Any],
    leaves: list[Any],
    positions: list[int],
    perturbed: list[int],
) -> TypeError:
    """The error for a gradient taken with respect to an array keyword argument of a
    kernel with a custom VJP (whose cotangents are for positional arguments only)."""
    flat_kwargs = jax.tree_util.tree_flatten_with_path(kwargs)[0]
    first_kwarg_leaf = len(leaves) - len(flat_kwargs)
    names = []
    for i in perturbed:
        path, _ = flat_kwargs[positions[i] - first_kwarg_leaf]
        names.append(repr(f"{path[0].key}{jax.tree_util.keystr(tuple(path[1:]))}"))
    return TypeError(
        f"kernel {op_id!r}: a gradient with respect to keyword argument {', '.join(names)} "
        "was asked for, but the kernel's custom gradient (vjp / custom_vjp) returns "
        "cotangents for its positional arguments only, so it would be zero. Pass the "
        "array as a positional argument (and return its cotangent from vjp), or hold it "
        "constant (jax.lax.stop_gradient)."
    )


def _instantiate_zeros(tree: Any) -> Any:
    """`tree` with JAX's symbolic zero cotangents (outputs that do not reach the loss)
    made into arrays of zeros, as the kernel's vjp expects."""
    zero_type = jax.custom_derivatives.SymbolicZero

    def leaf(x: Any) -> Any:
        if not isinstance(x, zero_type):
            return x
        if x.dtype == jax.dtypes.float0:
            return np.zeros(x.shape, x.dtype)
        return jnp.zeros(x.shape, x.dtype)

    return jax.tree_util.tree_map(leaf, tree, is_leaf=lambda x: isinstance(x, zero_type))


# Second derivatives. Under grad-of-grad or a hessian, JAX differentiates the custom
# VJP's forward and backward themselves. A Pallas or Triton kernel cannot be, so when the
# kernel declares its op's reference math, both are wrapped in a custom JVP that keeps
# the kernel's values and takes the *derivative* from the reference: the backward's
# derivative is that of the reference's VJP, which depends on the primal inputs and the
# cotangent only (the forward's residuals carry no derivative of their own: zero).
# Without a reference, JAX differentiates the kernel's own code, with a clear error
# when it cannot.


def _second_order_of_own_code(fn: Callable[..., Any], op_id: str, cfg: Any) -> Callable[..., Any]:
    """`fn`, differentiated by JAX (fine for a kernel written in plain JAX); when JAX
    cannot (a Pallas or Triton call, a callback), one error naming the op and the fix."""

    @jax.custom_jvp
    def once(*primals: Any) -> Any:
        return fn(*primals)

    @once.defjvp
    def once_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> Any:
        try:
            return jax.jvp(fn, primals, tangents)
        except Exception as e:  # re-raised below with the op's name and the fix
            raise TypeError(
                f"kernel {op_id!r}: second derivatives (grad of grad, hessian) are not "
                f"available with config {cfg!r}: its custom gradient runs code JAX cannot "
                "differentiate. Define `reference(self, *args, **kwargs)` on the kernel "
                "(the op's math in plain JAX; second derivatives are then taken from it), "
                "or call the op with a config JAX differentiates itself "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})."
            ) from e

    return once


def _second_order_from_reference(
    forward: Callable[..., Any], reference: Callable[..., Any]
) -> Callable[..., Any]:
    @jax.custom_jvp
    def once(*dyn: Any) -> Any:
        return forward(*dyn)

    @once.defjvp
    def once_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> Any:
        out, residuals = forward(*primals)
        _, t_out = jax.jvp(reference, primals, tangents)
        return (out, residuals), (_like(t_out, out), _zero_tangents(residuals))

    return once


def _second_order_from_reference_vjp(
    backward: Callable[..., Any], reference: Callable[..., Any]
) -> Callable[..., Any]:
    @jax.custom_jvp
    def once(residuals: Any, out: Any, dyn: Any, dout: Any) -> Any:
        return backward(residuals, out, dyn, dout)

    @once.defjvp
    def once_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> Any:
        cts = backward(*primals)
        _, _, dyn, dout = primals
        _, _, t_dyn, t_dout = tangents

        def reference_vjp(dyn: Any, dout: Any) -> Any:
            return jax.vjp(reference, *dyn)[1](dout)

        _, t_cts = jax.jvp(reference_vjp, (dyn, dout), (t_dyn, t_dout))
        return cts, _like(tuple(t_cts), cts)

    return once


def _tangent_dtype(x: Any) -> Any:
    dtype = codec.array_dtype(x)  # typed PRNG keys too: no tangent (float0)
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else jax.dtypes.float0


def _like(tangents: Any, primals: Any) -> Any:
    """`tangents` in the structure and tangent dtypes of `primals` (the reference may
    compute in another precision than the kernel)."""

    def fit(t: Any, p: Any) -> Any:
        dtype = _tangent_dtype(p)
        if dtype == jax.dtypes.float0:
            return np.zeros(p.shape, dtype)
        return jnp.asarray(t).astype(dtype)

    return jax.tree_util.tree_map(fit, tangents, primals)


def _zero_tangents(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: np.zeros(x.shape, _tangent_dtype(x)), tree)


def _dyn_cotangents(cts: Any, args: tuple[Any, ...], dyn: Sequence[Any]) -> tuple[Any, ...]:
    """Maps the kernel's per-positional-argument cotangents onto the dynamic leaves
    (array leaves of args, then of kwargs), with zeros where the kernel gave None."""
    if not isinstance(cts, (tuple, list)):
        cts = (cts,)
    if len(cts) > len(args):
        raise ValueError(
            f"the kernel's vjp returned {len(cts)} cotangents for {len(args)} positional "
            "arguments; return one per positional argument (None for non-arrays)."
        )
    cts = tuple(cts) + (None,) * (len(args) - len(cts))
    out: list[Any] = []
    for i, (arg, ct) in enumerate(zip(args, cts, strict=True)):
        arrays = [x for x in jax.tree_util.tree_leaves(arg) if keys.is_array(x)]
        if ct is None:
            out.extend(None for _ in arrays)
            continue
        ct_leaves = jax.tree_util.tree_leaves(ct)
        if len(ct_leaves) != len(arrays):
            raise ValueError(
                f"the kernel's vjp returned a cotangent with {len(ct_leaves)} arrays for "
                f"positional argument {i}, which has {len(arrays)}."
            )
        out.extend(ct_leaves)
    out.extend(None for _ in range(len(dyn) - len(out)))  # array kwargs: no cotangent.
    return tuple(_fit_cotangent(ct, primal) for ct, primal in zip(out, dyn, strict=True))


def _fit_cotangent(ct: Any, primal: Any) -> Any:
    dtype = codec.array_dtype(primal)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return np.zeros(primal.shape, dtype=jax.dtypes.float0)
    if ct is None:
        return _varying_like(jnp.zeros(primal.shape, dtype), primal)
    return _varying_like(jnp.asarray(ct).astype(dtype), primal)


def _varying_like(ct: Any, primal: Any) -> Any:
    """`ct` varying over the mesh axes `primal` varies over, as JAX requires of a custom
    VJP's cotangent inside `shard_map`. A primal replicated along an axis that its
    cotangent varies over (weights beside split tokens) gets the sum over that axis,
    as JAX's own autodiff gives it (the transpose of using one value on every device);
    a cotangent alike on every device is marked varying where its primal varies."""
    have, want = jax_compat.varying_axes(ct), jax_compat.varying_axes(primal)
    if extra := tuple(sorted(have - want)):
        ct = jax.lax.psum(ct, extra)
    if missing := tuple(sorted(want - have)):
        ct = jax.lax.pcast(ct, missing, to="varying")
    return ct
