"""`softmax`: the public function and its kernel."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from kerneltune._src.execution.default import default_executor
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import Invocation
from kerneltune.kernels._args import as_array, explicitly_sharded, normalize_axes, to_rows
from kerneltune.kernels._common import interpreted, kernel_for
from kerneltune.kernels.softmax import config as config_lib
from kerneltune.kernels.softmax.config import SoftmaxConfig, SoftmaxProblem
from kerneltune.kernels.softmax.pallas_triton import TritonBackend
from kerneltune.kernels.softmax.reference import XlaBackend, softmax_xla


def problem_of(inv: Invocation[Any, Any]) -> SoftmaxProblem:
    return SoftmaxProblem.of(inv.args[0])


class Softmax(BackendKernel[SoftmaxConfig]):
    """Softmax over the last axis: our Pallas GPU kernel with a tuned warp count on
    GPUs, XLA elsewhere. Its gradient is computed from the output (`p · (g − Σ g·p)`);
    the public `softmax` gives it as a JVP, so forward mode works as with `jax.nn`.

    `SoftmaxConfig` has no backend field: its configs are the Triton kernel's; XLA
    runs where Pallas does not (CPUs, TPUs, `KERNELTUNE_PLATFORM=xla`).
    """

    op_id = "softmax"
    version = "1"
    config_type = SoftmaxConfig
    backends = (XlaBackend(), TritonBackend())

    def config_backend(self, cfg: SoftmaxConfig) -> str:
        return "triton"

    def prepare(self, x: Any):
        if getattr(x, "ndim", 0) < 1 or not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(
                f"{self.op_id}: x must be a floating-point array with at least one dimension."
            )
        return (x,), {}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> SoftmaxConfig:
        return config_lib.heuristic(problem_of(inv))

    def search_space(self, inv: Invocation[Any, Any]):
        return config_lib.candidates(problem_of(inv))

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[SoftmaxConfig]:
        return config_lib.interpret_candidates(problem_of(inv))

    def config_across_sizes(self, cfg: Any, sizes: Sequence[int]) -> Any:
        # sizes: x as [rows, width].
        return config_lib.across_widths(cfg, int(sizes[-1])) if sizes else cfg

    def reference(self, x):
        """The op's math in plain JAX: second derivatives are taken from it."""
        return softmax_xla(x)


#: `Softmax`'s Pallas path run by the Pallas interpreter on any device (tests, the
#: CPU demo; timings measure the interpreter).
SoftmaxInterpret = interpreted(Softmax)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _softmax_rows(rows: jax.Array, executor: Any, cfg: SoftmaxConfig | None) -> jax.Array:
    """The kernel's softmax of `[rows, width]`, differentiated as `jax.nn.softmax` is:
    by a JVP from the output, `p · (t − Σ t·p)`, which JAX takes forward (`jax.jvp`,
    `jax.jacfwd`) and transposes for reverse mode. The kernel's own gradient is a custom
    VJP, which JAX does not take forward; its math is the same, so reverse mode loses
    nothing."""
    return executor(kernel_for(Softmax, executor), rows, cfg=cfg)


@_softmax_rows.defjvp
def _softmax_rows_jvp(executor: Any, cfg: Any, primals: Any, tangents: Any) -> Any:
    (rows,), (t,) = primals, tangents
    out = _softmax_rows(rows, executor, cfg)  # itself: a JVP of the JVP works too
    p, t = out.astype(jnp.float32), t.astype(jnp.float32)
    return out, (p * (t - jnp.sum(t * p, axis=-1, keepdims=True))).astype(out.dtype)


def softmax(
    x: jax.Array,
    axis: int | tuple[int, ...] | None = -1,
    where: jax.Array | None = None,
    *,
    cfg: SoftmaxConfig | None = None,
    executor: Any = None,
) -> jax.Array:
    """`jax.nn.softmax` with a tuned config.

    One axis of a floating array runs through the tuned kernel (moved last and back).
    Several axes (`axis=None`: all of them), a `where` mask, a float64 array or an
    integer array (which `jax.nn.softmax` promotes to float) are what the kernel does
    not take, nor (given no `cfg`) an array sharded over explicit mesh axes: such
    calls compute exactly what `jax.nn.softmax` computes, through XLA.

    Args:
      x: the array.
      axis: the axis or axes to normalise over; None: all.
      where: elements to include; excluded ones come out as 0 (as `jax.nn.softmax`).
      cfg: a `SoftmaxConfig` to use instead of the chosen one.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import softmax
      >>> softmax(jnp.zeros((2, 4))).tolist()
      [[0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]]
      >>> softmax(jnp.zeros((2, 2)), axis=None).tolist()
      [[0.25, 0.25], [0.25, 0.25]]
    """
    op = "softmax"
    x = as_array(op, "x", x)
    if where is not None:
        where = as_array(op, "where", where)
        try:
            jnp.broadcast_shapes(where.shape, x.shape)
        except ValueError:
            raise ValueError(
                f"{op}: where must broadcast to x's shape {x.shape}, got {where.shape}."
            ) from None
    if axis is None:
        axis = tuple(range(x.ndim))
    # The kernel takes floating x over one axis; anything else is jax.nn.softmax's.
    # (`axis == ()` only for a tuple: a NumPy integer axis compared with `()` is an
    # empty array, whose truth value NumPy refuses.)
    no_axes = isinstance(axis, tuple) and not axis
    # float64 too is jax.nn.softmax's: the kernels compute in float32.
    takes_x = jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != jnp.float64
    takes_axes = takes_x and x.ndim > 0 and not no_axes
    axes = normalize_axes(op, axis, x.ndim) if takes_axes else ()
    # Sharding in types (an explicit mesh): the rows would merge sharded axes.
    if len(axes) != 1 or where is not None or (cfg is None and explicitly_sharded(x)):
        return jax.nn.softmax(x, axis=axis, where=where)
    ex = executor if executor is not None else default_executor()
    rows, back = to_rows(x, axes)
    if not isinstance(rows, jax.core.Tracer):  # nothing differentiates a concrete call;
        return back(ex(kernel_for(Softmax, ex), rows, cfg=cfg))  # the JVP costs 0.1 ms
    return back(_softmax_rows(rows, ex, cfg))
