"""JAX's Pallas GPU softmax (`jax.experimental.pallas.ops.gpu.softmax.softmax`) with
the warp count chosen by kerneltune."""

from __future__ import annotations

import jax

from kerneltune.kernels._common import accepts, jax_gpu_op
from kerneltune.kernels.softmax.config import SoftmaxConfig
from kerneltune.kernels.softmax.reference import SoftmaxGradient


def softmax_pallas(x: jax.Array, *, cfg: SoftmaxConfig, interpret: bool) -> jax.Array:
    """Softmax over the last axis by JAX's Pallas kernel with `cfg.num_warps`."""
    module = jax_gpu_op("softmax")

    kwargs = {"axis": -1, "interpret": interpret}
    if accepts(module.softmax, "num_warps"):
        kwargs["num_warps"] = cfg.num_warps
    return module.softmax(x, **kwargs)


class TritonBackend(SoftmaxGradient):
    """JAX's Pallas softmax with a tuned warp count, lowered by Triton."""

    name = "triton"
    lowering = "triton"
    interprets = True

    def run(self, kernel, x, *, cfg: SoftmaxConfig):
        return softmax_pallas(x, cfg=cfg, interpret=kernel.use_interpreter())
