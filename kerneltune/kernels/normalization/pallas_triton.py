"""Layer norm and RMS norm with JAX's Pallas GPU kernels
(`jax.experimental.pallas.ops.gpu.layer_norm` / `rms_norm`), launched with the block
size and warps chosen by kerneltune.

JAX's public `layer_norm`/`rms_norm` entry points compute their own block size and
warps (they overwrite a `num_warps` argument), so the forward launches JAX's public
kernel bodies (`layer_norm_forward_kernel`, `rms_norm_forward_kernel`) itself, one
program per row, with our config; it keeps the statistics in float32. The backward is
JAX's own (`layer_norm_backward`, `rms_norm_backward`) on those statistics. Where this
JAX's kernel bodies or backward take other arguments than expected, the code raises a
clear error (forward) or differentiates the XLA version (backward), logging once.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._common import jax_gpu_op, parameters, triton_compiler_params
from kerneltune.kernels.normalization.config import NormConfig
from kerneltune.kernels.normalization.reference import layer_norm_xla, rms_norm_xla

logger = logging.getLogger("kerneltune")

_BACKWARD_PARAMS = (
    "num_warps",
    "num_stages",
    "eps",
    "backward_pass_impl",
    "interpret",
    "res",
    "do",
)


#: For each norm, JAX's kernel body and backward in its module
#: `jax.experimental.pallas.ops.gpu.<norm>`, named in full so that a reader (or a
#: search) finds them.
_JAX_NAMES = {
    "layer_norm": ("layer_norm_forward_kernel", "layer_norm_backward"),
    "rms_norm": ("rms_norm_forward_kernel", "rms_norm_backward"),
}


def _ops(which: str) -> Any:
    return jax_gpu_op(which)


def _forward(
    which: str,
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array,
    *,
    cfg: NormConfig,
    eps: float,
    interpret: bool,
    with_stats: bool,
) -> Any:
    module = _ops(which)
    body_name = _JAX_NAMES[which][0]
    body = getattr(module, body_name, None)
    params = parameters(body) if body is not None else None
    if body is None or params is None or not {"eps", "block_size"} <= set(params):
        raise NotImplementedError(
            f"this JAX's pallas.ops.gpu.{which}.{body_name} is missing or takes "
            f"other arguments ({params}); use the XLA path (KERNELTUNE_PLATFORM=xla)."
        )
    n = x.shape[-1]
    rows = x.reshape((-1, n))
    out_shape: Any = jax.ShapeDtypeStruct((n,), x.dtype)
    if with_stats:
        stat = jax.ShapeDtypeStruct((), jnp.float32)
        stats = [stat, stat] if which == "layer_norm" else [stat]
        out_shape = [out_shape, *stats]
    call = pl.pallas_call(
        functools.partial(body, eps=eps, block_size=cfg.block_size),
        out_shape=out_shape,
        grid=(),
        compiler_params=None if interpret else triton_compiler_params(num_warps=cfg.num_warps),
        interpret=interpret,
        name=f"kerneltune_{which}",
    )
    # JAX's kernel bodies mix the float32 statistics with the parameters, which only
    # type-checks under standard dtype promotion when they are 16-bit: pass float32.
    f32 = jnp.float32
    result = jax.vmap(call, in_axes=(0, None, None))(rows, weight.astype(f32), bias.astype(f32))
    if not with_stats:
        return result.reshape(x.shape)
    out, *stats = result
    return out.reshape(x.shape), tuple(s.reshape(x.shape[:-1]) for s in stats)


def layer_norm_pallas(
    x, weight, bias, *, cfg: NormConfig, eps: float, interpret: bool, with_stats: bool = False
):
    """Layer norm over the last axis; with `with_stats`, also `(mean, rstd)` in float32."""
    return _forward(
        "layer_norm", x, weight, bias, cfg=cfg, eps=eps, interpret=interpret, with_stats=with_stats
    )


def rms_norm_pallas(
    x, weight, *, cfg: NormConfig, eps: float, interpret: bool, with_stats: bool = False
):
    """RMS norm over the last axis; with `with_stats`, also `(rstd,)` in float32."""
    bias = jnp.zeros_like(weight)
    return _forward(
        "rms_norm", x, weight, bias, cfg=cfg, eps=eps, interpret=interpret, with_stats=with_stats
    )


def _jax_backward(which: str) -> Any:
    backward = getattr(_ops(which), _JAX_NAMES[which][1], None)
    if backward is not None and parameters(backward) == _BACKWARD_PARAMS:
        return backward
    _warn_fallback_once(which, parameters(backward) if backward is not None else None)
    return None


def layer_norm_backward_pallas(x, weight, bias, stats, dout, *, eps: float, interpret: bool):
    """dx, dweight, dbias by JAX's Pallas backward (its own launch parameters)."""
    backward = _jax_backward("layer_norm")
    if backward is None:
        _, pullback = jax.vjp(functools.partial(layer_norm_xla, eps=eps), x, weight, bias)
        return pullback(dout)
    mean, rstd = stats
    return backward(None, None, eps, "triton", interpret, (x, weight, bias, mean, rstd), dout)


def rms_norm_backward_pallas(x, weight, stats, dout, *, eps: float, interpret: bool):
    """dx, dweight by JAX's Pallas backward (its own launch parameters)."""
    backward = _jax_backward("rms_norm")
    if backward is None:
        _, pullback = jax.vjp(functools.partial(rms_norm_xla, eps=eps), x, weight)
        return pullback(dout)
    (rstd,) = stats
    dx, dw, _ = backward(
        None, None, eps, "triton", interpret, (x, weight, jnp.zeros_like(weight), rstd), dout
    )
    return dx, dw


@functools.cache
def _warn_fallback_once(which: str, found: Any) -> None:
    logger.warning(
        "kerneltune %s: JAX's %s_backward takes other arguments than expected (%s); the "
        "backward pass differentiates the XLA version instead.",
        which,
        which,
        found,
    )


class TritonBackend(Backend):
    """JAX's Pallas norm kernels with a tuned block size and warp count, and JAX's
    Pallas backward (the config's backend is called "pallas")."""

    name = "pallas"
    lowering = "triton"
    interprets = True

    def run(self, kernel, x, *params, cfg: NormConfig, eps: float):
        interpret = kernel.use_interpreter()
        if kernel.which == "layer_norm":
            weight, bias = params
            return layer_norm_pallas(x, weight, bias, cfg=cfg, eps=eps, interpret=interpret)
        (weight,) = params
        return rms_norm_pallas(x, weight, cfg=cfg, eps=eps, interpret=interpret)

    def fwd_with_residuals(self, kernel, x, *params, cfg: NormConfig, eps: float):
        interpret = kernel.use_interpreter()
        if kernel.which == "layer_norm":
            weight, bias = params
            return layer_norm_pallas(
                x, weight, bias, cfg=cfg, eps=eps, interpret=interpret, with_stats=True
            )
        (weight,) = params
        return rms_norm_pallas(x, weight, cfg=cfg, eps=eps, interpret=interpret, with_stats=True)

    def vjp(self, kernel, stats, out, dout, x, *params, cfg: NormConfig, eps: float):
        interpret = kernel.use_interpreter()
        dout = dout.astype(x.dtype)
        if kernel.which == "layer_norm":
            weight, bias = params
            return layer_norm_backward_pallas(
                x, weight, bias, stats, dout, eps=eps, interpret=interpret
            )
        (weight,) = params
        return rms_norm_backward_pallas(x, weight, stats, dout, eps=eps, interpret=interpret)
