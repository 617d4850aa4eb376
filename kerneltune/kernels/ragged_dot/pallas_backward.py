"""The gradient of the Pallas backends (Triton, Mosaic GPU): two more grouped matmuls,
d_lhs and d_rhs, each run as its own kernel (`RaggedDotGradLhs`, `RaggedDotGradRhs`)
so that each is tuned for its own shapes."""

from __future__ import annotations

from typing import Any

import numpy as np

from kerneltune._src.kernel.backends import Backend


class PallasGradient(Backend):
    """A forward backend whose backward runs the op's two gradient kernels through the
    kernel's executor. With a `group_offset`, both take it too: d_lhs is zero outside
    the local groups' rows, and d_rhs (`[G_local, K, N]`) reads only those rows."""

    # The backward kernels take no part of this config: tuned at their own keys.
    backward_tuned_apart = True

    def vjp(
        self, kernel: Any, residuals, out, dout, lhs, rhs, group_sizes, group_offset=None, *,
        cfg, out_dtype,
    ):  # fmt: skip
        ex = kernel.inner_executor()
        dout = dout.astype(lhs.dtype)
        lhs_dtype, rhs_dtype = np.dtype(lhs.dtype).name, np.dtype(rhs.dtype).name
        if group_offset is None:
            d_lhs = ex(kernel.grad_lhs, dout, rhs, group_sizes, out_dtype=lhs_dtype)
            d_rhs = ex(kernel.grad_rhs, lhs, dout, group_sizes, out_dtype=rhs_dtype)
            return d_lhs, d_rhs, None
        d_lhs = ex(kernel.grad_lhs, dout, rhs, group_sizes, group_offset, out_dtype=lhs_dtype)
        d_rhs = ex(
            kernel.grad_rhs, lhs, dout, group_sizes, group_offset,
            out_dtype=rhs_dtype, local_groups=int(rhs.shape[0]),
        )  # fmt: skip
        return d_lhs, d_rhs, None, None
