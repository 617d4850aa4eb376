"""`layer_norm` and `rms_norm`: the public functions and their kernels."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.kernel import Invocation, Kernel
from kerneltune.kernels._common import BundledKernelMixin, Pruned, kernel_for
from kerneltune.kernels.normalization import config as config_lib
from kerneltune.kernels.normalization.config import NormConfig, NormProblem
from kerneltune.kernels.normalization.pallas_triton import (
    layer_norm_backward_pallas,
    layer_norm_pallas,
    rms_norm_backward_pallas,
    rms_norm_pallas,
)
from kerneltune.kernels.normalization.reference import layer_norm_xla, rms_norm_xla


def problem_of(inv: Invocation[Any, Any]) -> NormProblem:
    x = inv.args[0]
    n = int(x.shape[-1])
    return NormProblem(
        rows=int(np.prod(x.shape[:-1], dtype=np.int64)), n=n, dtype=np.dtype(x.dtype)
    )


class _Norm(BundledKernelMixin, Kernel[NormConfig, jax.Array]):
    """What layer norm and RMS norm share: config, candidates, argument checks."""

    version = "1"
    config_type = NormConfig
    _params: tuple[str, ...] = ()

    def __init__(
        self, op_id: str | None = None, *, name: str | None = None, executor: Any = None
    ) -> None:
        super().__init__(op_id, name=name)
        self._init_executor(executor)

    def prepare(self, x: Any, *params: Any, eps: float = 1e-5):
        if getattr(x, "ndim", 0) < 1 or not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(
                f"{self.op_id}: x must be a floating-point array with at least one dimension, got {x!r:.80}."
            )
        if len(params) != len(self._params):
            raise TypeError(
                f"{self.op_id} takes x, {', '.join(self._params)}; got {1 + len(params)} arrays."
            )
        for pname, p in zip(self._params, params):
            if tuple(getattr(p, "shape", ())) != (x.shape[-1],):
                raise ValueError(
                    f"{self.op_id}: {pname} must have shape ({x.shape[-1]},), got {getattr(p, 'shape', p)}."
                )
        return (x, *params), {"eps": float(eps)}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> NormConfig:
        return config_lib.heuristic(problem_of(inv))

    def candidate_cfgs_triton(self, inv: Invocation[Any, Any]) -> list[NormConfig]:
        if self.use_interpreter():
            return config_lib.interpret_candidates(problem_of(inv))
        return config_lib.candidates(problem_of(inv))[0]

    def pruned_cfgs(self, inv: Invocation[Any, Any]) -> list[Pruned[NormConfig]]:
        return config_lib.candidates(problem_of(inv))[1]


class LayerNorm(_Norm):
    """Layer norm over the last axis: JAX's Pallas GPU kernel with a tuned block size
    and warp count on GPUs (JAX's Pallas backward), XLA elsewhere."""

    op_id = "layer_norm"
    _params = ("weight", "bias")

    def run_triton(self, x, weight, bias, *, cfg: NormConfig, eps: float):
        return layer_norm_pallas(
            x, weight, bias, cfg=cfg, eps=eps, interpret=self.use_interpreter()
        )

    def fwd_with_residuals_triton(self, x, weight, bias, *, cfg: NormConfig, eps: float):
        return layer_norm_pallas(
            x, weight, bias, cfg=cfg, eps=eps, interpret=self.use_interpreter(), with_stats=True
        )

    def vjp_triton(self, stats, out, dout, x, weight, bias, *, cfg: NormConfig, eps: float):
        return layer_norm_backward_pallas(
            x, weight, bias, stats, dout.astype(x.dtype), eps=eps, interpret=self.use_interpreter()
        )

    def run_xla(self, x, weight, bias, *, cfg: NormConfig, eps: float):
        return layer_norm_xla(x, weight, bias, eps=eps)


class RMSNorm(_Norm):
    """RMS norm over the last axis (`x / rms(x) · weight`): JAX's Pallas GPU kernel
    with a tuned block size and warp count on GPUs, XLA elsewhere."""

    op_id = "rms_norm"
    _params = ("weight",)

    def run_triton(self, x, weight, *, cfg: NormConfig, eps: float):
        return rms_norm_pallas(x, weight, cfg=cfg, eps=eps, interpret=self.use_interpreter())

    def fwd_with_residuals_triton(self, x, weight, *, cfg: NormConfig, eps: float):
        return rms_norm_pallas(
            x, weight, cfg=cfg, eps=eps, interpret=self.use_interpreter(), with_stats=True
        )

    def vjp_triton(self, stats, out, dout, x, weight, *, cfg: NormConfig, eps: float):
        return rms_norm_backward_pallas(
            x, weight, stats, dout.astype(x.dtype), eps=eps, interpret=self.use_interpreter()
        )

    def run_xla(self, x, weight, *, cfg: NormConfig, eps: float):
        return rms_norm_xla(x, weight, eps=eps)


class LayerNormInterpret(LayerNorm):
    """`LayerNorm`'s Pallas path run by the Pallas interpreter on any device (tests,
    the CPU demo; timings measure the interpreter)."""

    op_id = "layer_norm-interpret"
    interpret = True
    run_xla = LayerNorm.run_triton
    fwd_with_residuals_xla = LayerNorm.fwd_with_residuals_triton
    vjp_xla = LayerNorm.vjp_triton
    candidate_cfgs_xla = LayerNorm.candidate_cfgs_triton


class RMSNormInterpret(RMSNorm):
    """`RMSNorm`'s Pallas path run by the Pallas interpreter on any device."""

    op_id = "rms_norm-interpret"
    interpret = True
    run_xla = RMSNorm.run_triton
    fwd_with_residuals_xla = RMSNorm.fwd_with_residuals_triton
    vjp_xla = RMSNorm.vjp_triton
    candidate_cfgs_xla = RMSNorm.candidate_cfgs_triton


def _executor(executor: Any) -> Any:
    from kerneltune._src.executor import default_executor

    return executor if executor is not None else default_executor()


def layer_norm(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array,
    *,
    eps: float = 1e-5,
    cfg: NormConfig | None = None,
    executor: Any = None,
) -> jax.Array:
    """Layer norm over the last axis with a tuned config.

    Args:
      x: `[..., n]`.
      weight, bias: `[n]`.
      eps: added to the variance.
      cfg: a `NormConfig` to use instead of the chosen one.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import layer_norm
      >>> y = layer_norm(jnp.arange(8.0).reshape(2, 4), jnp.ones(4), jnp.zeros(4))
      >>> [round(float(v), 3) for v in y[0]]
      [-1.342, -0.447, 0.447, 1.342]
    """
    ex = _executor(executor)
    return ex(kernel_for(LayerNorm, ex), x, weight, bias, eps=eps, cfg=cfg)


def rms_norm(
    x: jax.Array,
    weight: jax.Array,
    *,
    eps: float = 1e-5,
    cfg: NormConfig | None = None,
    executor: Any = None,
) -> jax.Array:
    """RMS norm over the last axis with a tuned config: `x / sqrt(mean(x²) + eps) · weight`.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import rms_norm
      >>> rms_norm(jnp.full((2, 4), 3.0), jnp.ones(4)).round(3).tolist()
      [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    """
    ex = _executor(executor)
    return ex(kernel_for(RMSNorm, ex), x, weight, eps=eps, cfg=cfg)
