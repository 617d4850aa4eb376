"""tokamax's `ragged_dot` as an optional forward backend.

tokamax (openxla's kernel library) is not a dependency: where it is installed, its
default `ragged_dot` joins the forward's candidates, so a tuned call is never slower
than what a tokamax user already has. It brings its own backward, which JAX
differentiates. Importing kerneltune never imports tokamax: it is found with
`importlib.util.find_spec` and imported by the first call that runs it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

import numpy as np

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._common import on_gpu


@functools.cache
def installed() -> bool:
    """Whether `tokamax` can be found (found only: importing it is slow)."""
    return importlib.util.find_spec("tokamax") is not None


#: Why tokamax is not offered for a call with `group_offset` (read in tokamax's
#: `_src/ops/ragged_dot/api.py`, its repository's main branch of August 2026).
NO_OFFSET = (
    "tokamax's ragged_dot takes no group_offset (it raises NotImplementedError for any value)"
)


def unsupported(dtype: np.dtype, out_dtype: np.dtype, offset: bool = False) -> str | None:
    """Why tokamax's `ragged_dot` cannot run a call (`offset`: one with a
    `group_offset`), or None when it can."""
    if offset:
        return NO_OFFSET
    if not installed():
        return "tokamax is not installed (pip install tokamax)"
    if not on_gpu():
        return "tokamax's ragged_dot is offered on GPUs only"
    if np.dtype(dtype).kind != "f" and np.dtype(dtype).name != "bfloat16":
        return f"tokamax's ragged_dot is offered for floating inputs, not {np.dtype(dtype)}"
    if np.dtype(out_dtype) != np.dtype(dtype):
        return (
            f"tokamax's ragged_dot is offered where the output keeps the inputs' dtype "
            f"({np.dtype(dtype)}), not {np.dtype(out_dtype)}"
        )
    return None


def ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, *, out_dtype: str) -> Any:
    """`lhs[M, K]` times each group's `rhs[g]` by tokamax's default implementation."""
    if np.dtype(out_dtype) != np.dtype(lhs.dtype):
        raise ValueError(
            f"RaggedDotConfig(backend='tokamax') keeps the inputs' dtype {lhs.dtype}; the "
            f"call wants {out_dtype}."
        )
    from kerneltune.kernels.ragged_dot.reference import rows_after_groups_zeroed

    tokamax = importlib.import_module("tokamax")
    # tokamax 0.0.17 leaves the output rows after the last group unwritten (NaN seen on
    # an H100) and its d_lhs there nonzero; masking the rows on both sides gives
    # `jax.lax.ragged_dot`'s zeros, forward and backward.
    lhs = rows_after_groups_zeroed(lhs, group_sizes)
    return rows_after_groups_zeroed(tokamax.ragged_dot(lhs, rhs, group_sizes), group_sizes)


class TokamaxBackend(Backend):
    """tokamax's default `ragged_dot`, forward only (JAX differentiates it: tokamax
    brings its own backward)."""

    name = "tokamax"
    differentiated_by_jax = True

    def unusable(self, kernel, inv, cfg) -> str | None:
        if kernel.product != "fwd":
            return "tokamax is offered for the forward only (it brings its own backward)"
        p = kernel.problem(inv)
        return unsupported(p.dtype, p.out_dtype, p.local_g is not None)

    def run(self, kernel, lhs, rhs, group_sizes, group_offset=None, *, cfg, out_dtype: str):
        if group_offset is not None:
            raise ValueError(f"{kernel.op_id}: RaggedDotConfig(backend='tokamax'): {NO_OFFSET}.")
        return ragged_dot(lhs, rhs, group_sizes, out_dtype=out_dtype)
