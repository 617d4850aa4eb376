"""The gradient of the Pallas backends (Triton, Mosaic GPU): the same op on the two
transposed problems, each tuned for its own shapes through the kernel's executor."""

from __future__ import annotations

from typing import Any

from kerneltune._src.kernel.backends import Backend


class PallasGradient(Backend):
    """A backend whose backward is `d_x = d_out · yᵀ` and `d_y = xᵀ · d_out`, each a
    call of the kernel itself."""

    # The backward kernels take no part of this config: tuned at their own keys.
    backward_tuned_apart = True

    def vjp(self, kernel: Any, residuals, out, dout, x, y, *, cfg):
        ex = kernel.inner_executor()
        dout = dout.astype(x.dtype)
        return ex(kernel, dout, y.T), ex(kernel, x.T, dout)
