"""JAX's Pallas GPU attention (`jax.experimental.pallas.ops.gpu.attention.mha`) with
the launch parameters chosen by kerneltune.

The forward runs `mha(..., return_residuals=True)` for the output and log-sum-exp.
The backward runs JAX's backward pass on those residuals with its own block sizes
and warps, so forward and backward configs are independent. JAX keeps that backward
entry point private (`_mha_backward`); when its signature is not the one expected,
the backward falls back to differentiating `mha` itself with the backward config,
which recomputes the forward (correct, slower), and logs that once.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import jax

from kerneltune._src.core import jax_compat
from kerneltune._src.kernel.backends import Backend
from kerneltune._src.params import BwdParams, FwdParams
from kerneltune.kernels._common import accepts, jax_gpu_op, parameters
from kerneltune.kernels.attention.backward import BackwardKernelGradient, every_head
from kerneltune.kernels.attention.config import bwd_splits_alike

logger = logging.getLogger("kerneltune")

_BACKWARD_PARAMS = (
    "sm_scale",
    "causal",
    "block_sizes",
    "backward_pass_impl",
    "num_warps",
    "num_stages",
    "grid",
    "interpret",
    "debug",
    "return_residuals",
    "res",
    "do",
)


def _module() -> Any:
    return jax_gpu_op("attention")


def block_sizes(fwd: FwdParams | None = None, bwd: BwdParams | None = None) -> Any:
    """JAX's `BlockSizes` from our params (JAX's defaults where ours are None)."""
    cls = _module().BlockSizes
    default = cls.get_default()
    names = {f.name for f in dataclasses.fields(cls)}
    values = {name: getattr(default, name) for name in names}
    kv_name = "block_k" if "block_k" in names else "block_kv"
    if fwd is not None:
        values["block_q"] = fwd.q_blocksize or values["block_q"]
        values[kv_name] = fwd.kv_blocksize or values[kv_name]
    if bwd is not None:
        outer, inner = bwd.kv_blocksize, bwd.q_blocksize
        for name, value in (
            ("block_q_dkv", inner),
            ("block_kv_dkv", outer),
            ("block_q_dq", outer),
            ("block_kv_dq", inner),
        ):
            if name in names and value is not None:
                values[name] = value
    return cls(**values)


def _mha_kwargs(**kwargs: Any) -> dict[str, Any]:
    mha = _module().mha
    params = parameters(mha) or ()
    return {k: v for k, v in kwargs.items() if k in params and v is not None}


def mha_forward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    cfg: FwdParams,
    causal: bool,
    sm_scale: float,
    interpret: bool,
    return_residuals: bool,
) -> Any:
    """`mha` with `cfg`'s blocks, warps and stages; with `return_residuals`, also the
    base-2 log-sum-exp `[batch, heads, q_len]`."""
    mha = _module().mha
    if return_residuals and not accepts(mha, "return_residuals"):
        raise NotImplementedError("this JAX's mha cannot return its residuals (return_residuals=)")
    kwargs = _mha_kwargs(
        sm_scale=sm_scale,
        causal=causal,
        block_sizes=block_sizes(cfg),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        interpret=interpret,
    )
    if return_residuals:
        kwargs["return_residuals"] = True
    return mha(q, k, v, None, **kwargs)


def mha_backward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    out: jax.Array,
    lse: jax.Array,
    dout: jax.Array,
    *,
    cfg: BwdParams,
    causal: bool,
    sm_scale: float,
    interpret: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """dq, dk, dv by JAX's Pallas backward kernel with `cfg`'s blocks and warps."""
    module = _module()
    sizes = block_sizes(FwdParams(q_blocksize=cfg.kv_blocksize, kv_blocksize=cfg.kv_blocksize), cfg)
    backward = jax_compat.pallas_attention_backward(module)
    if backward is not None and parameters(backward) == _BACKWARD_PARAMS:
        dq, dk, dv, _ = backward(
            sm_scale,
            causal,
            sizes,
            "triton",
            cfg.num_warps,
            cfg.num_stages or 2,
            None,
            interpret,
            False,
            False,
            (q, k, v, None, out, lse),
            dout,
        )
        return dq, dk, dv
    _warn_fallback_once(parameters(backward) if backward is not None else None)
    kwargs = _mha_kwargs(
        sm_scale=sm_scale,
        causal=causal,
        block_sizes=sizes,
        num_warps=cfg.num_warps,
        interpret=interpret,
    )
    _, pullback = jax.vjp(lambda a, b, c: module.mha(a, b, c, None, **kwargs), q, k, v)
    return pullback(dout)


@functools.cache
def _warn_fallback_once(found: Any) -> None:
    logger.warning(
        "kerneltune attention: JAX's mha backward entry point has changed (found %s); "
        "the backward pass differentiates mha instead, recomputing the forward.",
        found,
    )


class TritonBackend(BackwardKernelGradient):
    """JAX's Pallas `mha` forward with tuned blocks, lowered by Triton; the backward is
    the `AttentionBackward` kernel (the config's backend is called "pallas")."""

    name = "pallas"
    lowering = "triton"
    interprets = True

    def run(self, kernel, q, k, v, *, cfg: FwdParams, causal: bool, sm_scale: float):
        return self._forward(kernel, q, k, v, cfg, causal, sm_scale, residuals=False)

    def fwd_with_residuals(self, kernel, q, k, v, *, cfg: FwdParams, causal: bool, sm_scale: float):
        return self._forward(kernel, q, k, v, cfg, causal, sm_scale, residuals=True)

    @staticmethod
    def _forward(kernel, q, k, v, cfg, causal, sm_scale, *, residuals: bool):
        # JAX's kernel wants k and v for every query head.
        k, v = every_head(q, k), every_head(q, v)
        return mha_forward(
            q, k, v, cfg=cfg, causal=causal, sm_scale=sm_scale,
            interpret=kernel.use_interpreter(), return_residuals=residuals,
        )  # fmt: skip


class TritonBackwardBackend(Backend):
    """JAX's Pallas `mha` backward with tuned blocks, lowered by Triton."""

    name = "pallas"
    lowering = "triton"
    interprets = True

    def unusable(self, kernel, inv, cfg: BwdParams) -> str | None:
        q_len, kv_len = int(inv.args[0].shape[1]), int(inv.args[1].shape[1])
        if cfg.kv_blocksize is not None and not bwd_splits_alike(q_len, kv_len, cfg):
            return (
                f"kv_blocksize={cfg.kv_blocksize} cuts the sequences ({q_len}, {kv_len}) "
                "into different numbers of blocks"
            )
        return super().unusable(kernel, inv, cfg)

    def run(
        self, kernel, q, k, v, out, lse, dout, *, cfg: BwdParams, causal: bool, sm_scale: float
    ):
        return mha_backward(
            q, k, v, out, lse, dout, cfg=cfg, causal=causal, sm_scale=sm_scale,
            interpret=kernel.use_interpreter(),
        )  # fmt: skip
