"""The gradient of the Pallas backends (Triton, Mosaic GPU): two more grouped matmuls,
d_lhs and d_rhs, each run as its own kernel (`RaggedDotGradLhs`, `RaggedDotGradRhs`)
so that each is tuned for its own shapes."""

from __future__ import annotations

from typing import Any

import numpy as np

from kerneltune._src.kernel.backends import Backend


class PallasGradient(Backend):
    """A forward backend whose backward runs the op's two gradient kernels through the
    kernel's executor."""

    def vjp(self, kernel: Any, residuals, out, dout, lhs, rhs, group_sizes, *, cfg, out_dtype):
        ex = kernel.inner_executor()
        dout = dout.astype(lhs.dtype)
        d_lhs = ex(kernel.grad_lhs, dout, rhs, group_sizes, out_dtype=np.dtype(lhs.dtype).name)
        d_rhs = ex(kernel.grad_rhs, lhs, dout, group_sizes, out_dtype=np.dtype(rhs.dtype).name)
        return d_lhs, d_rhs, None
