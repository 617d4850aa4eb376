"""`matmul`: the public function and its kernel."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.kernel import Invocation, Kernel
from kerneltune.kernels._common import BundledKernelMixin, Pruned, is_hopper, kernel_for
from kerneltune.kernels.matmul import config as config_lib
from kerneltune.kernels.matmul import mosaic_space, pallas_mosaic
from kerneltune.kernels.matmul.config import MatmulConfig, MatmulProblem
from kerneltune.kernels.matmul.pallas_mosaic import matmul_mosaic
from kerneltune.kernels.matmul.pallas_triton import matmul_pallas
from kerneltune.kernels.matmul.reference import matmul_xla


def problem_of(inv: Invocation[Any, Any]) -> MatmulProblem:
    x, y = inv.args[0], inv.args[1]
    return MatmulProblem(
        m=int(x.shape[0]), n=int(y.shape[1]), k=int(x.shape[1]), dtype=np.dtype(x.dtype)
    )


class Matmul(BundledKernelMixin, Kernel[MatmulConfig, jax.Array]):
    """`x[m, k] @ y[k, n]`: our Pallas tiled matmul on GPUs (Triton), `jnp.dot` on
    CPUs. On Hopper GPUs with 16-bit inputs the candidates also include JAX's Mosaic
    GPU Hopper matmul (`MatmulConfig(backend="mosaic")`), so tuning picks the faster
    backend per shape; the heuristic stays the Triton kernel. Its gradient runs the
    same kernel on the transposed problems, each tuned for its own shapes.

    Args:
      op_id: the op id (default "matmul").
      executor: the executor the backward pass's matmuls run through (default: the
        default executor).
    """

    op_id = "matmul"
    # 2: configs gained a backend and the Mosaic GPU fields.
    version = "2"
    config_type = MatmulConfig

    def __init__(
        self, op_id: str | None = None, *, name: str | None = None, executor: Any = None
    ) -> None:
        super().__init__(op_id, name=name)
        self._init_executor(executor)

    def prepare(self, x: Any, y: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if getattr(x, "ndim", None) != 2 or getattr(y, "ndim", None) != 2:
            raise ValueError(
                f"{self.op_id} takes 2-D x and y, got shapes {getattr(x, 'shape', x)} and "
                f"{getattr(y, 'shape', y)} (the `matmul` function flattens leading dims)."
            )
        if x.shape[1] != y.shape[0]:
            raise ValueError(
                f"{self.op_id}: x is {x.shape} and y is {y.shape}; x.shape[1] must equal y.shape[0]."
            )
        if np.dtype(x.dtype) != np.dtype(y.dtype):
            raise TypeError(
                f"{self.op_id}: x and y must have the same dtype, got {x.dtype} and {y.dtype}."
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{self.op_id} takes floating-point inputs, got {x.dtype}.")
        return (x, y), {}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> MatmulConfig:
        return config_lib.heuristic(problem_of(inv))

    def candidate_cfgs_triton(self, inv: Invocation[Any, Any]) -> list[MatmulConfig]:
        if self.use_interpreter():
            return config_lib.interpret_candidates(problem_of(inv))
        return self._candidates(problem_of(inv))[0]

    def pruned_cfgs(self, inv: Invocation[Any, Any]) -> list[Pruned[MatmulConfig]]:
        """The configs left out of the search for this call, each with its reason."""
        return self._candidates(problem_of(inv))[1]

    def _candidates(
        self, p: MatmulProblem
    ) -> tuple[list[MatmulConfig], list[Pruned[MatmulConfig]]]:
        if not self.use_interpreter() and mosaic_space.offered(p, hopper=is_hopper()):
            return mosaic_space.candidates_with_mosaic(p, support=pallas_mosaic.support())
        return config_lib.candidates(p)

    def run_triton(self, x: jax.Array, y: jax.Array, *, cfg: MatmulConfig) -> jax.Array:
        if cfg.backend == "mosaic":
            if self.use_interpreter():
                raise ValueError(
                    f"{self.op_id}: MatmulConfig(backend='mosaic') runs on Hopper GPUs, not "
                    "in the Pallas interpreter; use a backend='triton' config."
                )
            return matmul_mosaic(x, y, cfg)
        return matmul_pallas(x, y, cfg, interpret=self.use_interpreter())

    def fwd_with_residuals_triton(
        self, x: jax.Array, y: jax.Array, *, cfg: MatmulConfig
    ) -> tuple[jax.Array, None]:
        return self.run_triton(x, y, cfg=cfg), None

    def vjp_triton(
        self,
        residuals: None,
        out: jax.Array,
        dout: jax.Array,
        x: jax.Array,
        y: jax.Array,
        *,
        cfg: MatmulConfig,
    ) -> tuple[jax.Array, jax.Array]:
        ex = self.inner_executor()
        dout = dout.astype(x.dtype)
        return ex(self, dout, y.T), ex(self, x.T, dout)

    def run_xla(self, x: jax.Array, y: jax.Array, *, cfg: MatmulConfig) -> jax.Array:
        return matmul_xla(x, y)


class MatmulInterpret(Matmul):
    """The Pallas matmul run by the Pallas interpreter on any device, with a few tile
    shapes as candidates: for tests and the CPU demo. Its timings measure the
    interpreter, not a GPU."""

    op_id = "matmul-interpret"
    # Its configs and code did not change with the Mosaic backend (v2 of `Matmul`).
    version = "1"
    interpret = True
    run_xla = Matmul.run_triton
    fwd_with_residuals_xla = Matmul.fwd_with_residuals_triton
    vjp_xla = Matmul.vjp_triton
    candidate_cfgs_xla = Matmul.candidate_cfgs_triton


def matmul(
    x: jax.Array, y: jax.Array, *, cfg: MatmulConfig | None = None, executor: Any = None
) -> jax.Array:
    """`x @ y` with a tuned config: our Pallas kernel on GPUs (or JAX's Mosaic GPU
    matmul, where it wins the tuning on a Hopper GPU), `jnp.dot` on CPUs.

    Args:
      x: `[..., k]`; leading dimensions are flattened into rows.
      y: `[k, n]`, same dtype as `x`.
      cfg: a `MatmulConfig` to use instead of the chosen one.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Returns:
      `[..., n]` in `x`'s dtype.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import matmul
      >>> matmul(jnp.ones((2, 3, 4)), jnp.ones((4, 5))).shape
      (2, 3, 5)
    """
    if getattr(x, "ndim", 0) < 1:
        raise ValueError(
            f"matmul: x must have at least one dimension, got {getattr(x, 'shape', x)}."
        )
    from kerneltune._src.executor import default_executor

    ex = executor if executor is not None else default_executor()
    lead = x.shape[:-1]
    x2 = x.reshape((-1, x.shape[-1])) if x.ndim != 2 else x
    out = ex(kernel_for(Matmul, ex), x2, y, cfg=cfg)
    return out.reshape((*lead, y.shape[-1])) if x.ndim != 2 else out
