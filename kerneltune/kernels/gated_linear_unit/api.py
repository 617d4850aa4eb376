"""`gated_linear_unit`: the public function and its kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.execution.default import default_executor
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import Invocation
from kerneltune.kernels._args import (
    ShapeMismatch,
    as_array,
    cast,
    explicitly_sharded,
    last_axis_rows,
    reshape,
    symbolic,
)
from kerneltune.kernels._common import Pruned, interpreted, kernel_for
from kerneltune.kernels._flattened import call_flattened
from kerneltune.kernels.gated_linear_unit import config as config_lib
from kerneltune.kernels.gated_linear_unit import tokamax_backend
from kerneltune.kernels.gated_linear_unit.config import GLUConfig, GLUProblem
from kerneltune.kernels.gated_linear_unit.pallas_triton import TritonBackend
from kerneltune.kernels.gated_linear_unit.reference import (
    Weights,
    XlaBackend,
    XlaSplitBackend,
    glu_xla,
)
from kerneltune.kernels.gated_linear_unit.tokamax_backend import TokamaxBackend


def problem_of(inv: Invocation[Any, Any]) -> GLUProblem:
    x, w = inv.args[0], inv.args[1]
    # Shapes only: a recorded call's arguments are `jax.ShapeDtypeStruct`s.
    n = w[0].shape[1] if isinstance(w, tuple) else w.shape[2]
    return GLUProblem(m=int(x.shape[0]), k=int(x.shape[1]), n=int(n), dtype=np.dtype(x.dtype))


def check_weights(op: str, x: Any, w: Any) -> None:
    """Raises a TypeError or a ShapeMismatch naming what does not fit: the weights are
    fused `[K, 2, N]` or a pair of `[K, N]`, in x's floating dtype."""
    k = x.shape[-1]
    if isinstance(w, tuple):
        shapes = [tuple(a.shape) for a in w]
        if len(w) != 2 or shapes[0] != shapes[1] or len(shapes[0]) != 2 or shapes[0][0] != k:
            raise ShapeMismatch(
                f"{op}: weights as a pair must be two [K, N] arrays with K = x.shape[-1] = "
                f"{k}, got shapes {shapes}."
            )
        dtypes = [a.dtype for a in w]
    else:
        if w.ndim != 3 or w.shape[1] != 2 or w.shape[0] != k:
            raise ShapeMismatch(
                f"{op}: weights must be [K, 2, N] (or a pair of [K, N]) with K = "
                f"x.shape[-1] = {k}, got shape {tuple(w.shape)}."
            )
        dtypes = [w.dtype]
    if not jnp.issubdtype(x.dtype, jnp.floating) or any(d != x.dtype for d in dtypes):
        raise TypeError(
            f"{op}: x and weights must share one floating dtype, got {x.dtype} and "
            f"{[str(d) for d in dtypes]}."
        )


class GatedLinearUnit(BackendKernel[GLUConfig]):
    """`activation(x·W₀) ⊙ (x·W₁)` for `x[M, K]` and weights `[K, 2, N]` (or a pair of
    `[K, N]`), the activation a static argument. XLA by default; XLA's two-dot form of
    fused weights, our fused Pallas kernel and tokamax's are candidates on GPUs. Calls
    under a gradient are tuned apart, on forward + backward time (the fused kernel's
    backward is XLA's)."""

    op_id = "gated_linear_unit"
    version = "1"
    config_type = GLUConfig
    tunes_training_apart = True
    backends = (XlaBackend(), XlaSplitBackend(), TritonBackend(), TokamaxBackend())

    def prepare(self, x: Any, w: Any, *, activation: Callable[[Any], Any] = jax.nn.silu):
        if getattr(x, "ndim", None) != 2:
            raise ValueError(
                f"{self.op_id} takes a 2-D x, got shape {getattr(x, 'shape', x)} (the "
                "`gated_linear_unit` function flattens leading dims)."
            )
        w = tuple(w) if isinstance(w, list) else w
        check_weights(self.op_id, x, w)
        if not callable(activation):
            raise TypeError(f"{self.op_id}: activation must be callable, got {activation!r}.")
        return (x, w), {"activation": activation}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> GLUConfig:
        return config_lib.heuristic(problem_of(inv))

    def search_space(
        self, inv: Invocation[Any, Any]
    ) -> tuple[list[GLUConfig], list[Pruned[GLUConfig]]]:
        p = problem_of(inv)
        kept, pruned = config_lib.triton_candidates(p)
        if inv.differentiated:
            # The fused kernel's backward is XLA's (recomputing the projections): its
            # tiles move a training step little, so one of them is timed.
            first = kept[:1]
            why = "under a gradient only one fused-kernel tile is timed (its backward is XLA's)"
            pruned = [*pruned, *(Pruned(c, why) for c in kept[1:])]
            kept = first
        out = [config_lib.XLA]
        if isinstance(inv.args[1], tuple):
            why = "a pair of weights already runs as two dots under backend 'xla'"
            pruned = [*pruned, Pruned(config_lib.XLA_SPLIT, why)]
        else:
            out.append(config_lib.XLA_SPLIT)
        reason = tokamax_backend.unsupported()
        if reason is None:
            out.append(config_lib.TOKAMAX)
        else:
            pruned = [*pruned, Pruned(config_lib.TOKAMAX, reason)]
        return out + kept, pruned

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[GLUConfig]:
        return config_lib.interpret_candidates(problem_of(inv))

    def reference(self, x, w, *, activation) -> jax.Array:
        """The op's math in plain JAX: second derivatives are taken from it."""
        return glu_xla(x, w, activation)


#: The fused Pallas kernel run by the Pallas interpreter on any device, with a few
#: small tiles as candidates: for tests and the CPU demo.
GatedLinearUnitInterpret = interpreted(GatedLinearUnit)


def _identity(z: jax.Array) -> jax.Array:
    return z


def gated_linear_unit(
    x: jax.Array,
    weights: jax.Array | tuple[jax.Array, jax.Array],
    *,
    activation: Callable[[jax.Array], jax.Array] | None = jax.nn.silu,
    precision: Any = None,
    cfg: GLUConfig | None = None,
    executor: Any = None,
) -> jax.Array:
    """A gated linear unit: `activation(x·W₀) ⊙ (x·W₁)` (SwiGLU with the default
    `jax.nn.silu`, GEGLU with `jax.nn.gelu`), tokamax's argument forms.

    Args:
      x: `[..., K]` floating; leading dims are flattened into rows.
      weights: fused `[K, 2, N]` (`[:, 0]` the gate, `[:, 1]` the up projection), or a
        pair `(W₀, W₁)` of `[K, N]`. Another dtype than x's is promoted with x's as
        `jnp.matmul` promotes them (refused under strict dtype promotion).
      activation: applied to the gate projection; any function of one array (a static
        argument: functions are told apart by identity). None: no activation.
      precision: the projections' precision, as `jax.lax.dot`'s (tokamax's). None runs
        the tuned kernels; any other value plain JAX's dots at that precision.
      cfg: a `GLUConfig` to use instead of the chosen one.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Returns:
      `[..., N]` in x's dtype.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import gated_linear_unit
      >>> gated_linear_unit(jnp.ones((2, 3, 4)), jnp.ones((4, 2, 5))).shape
      (2, 3, 5)
    """
    op = "gated_linear_unit"
    x = as_array(op, "x", x)
    if x.ndim < 1:
        raise ValueError(f"{op}: x must have at least one dimension, got a scalar.")
    if isinstance(weights, (tuple, list)):
        if len(weights) != 2:
            raise ValueError(f"{op}: weights as a pair must have 2 arrays, got {len(weights)}.")
        w: Weights = tuple(as_array(op, f"weights[{i}]", a) for i, a in enumerate(weights))
    else:
        w = as_array(op, "weights", weights)
    out_dtype = x.dtype
    leaves = jax.tree.leaves(w)
    if jnp.issubdtype(x.dtype, jnp.floating) and any(a.dtype != x.dtype for a in leaves):
        # Weights of another dtype (float32 master weights, bfloat16 activations): both
        # promoted as `jnp.matmul` promotes them (refused under strict promotion, as
        # there), the result in x's dtype, as tokamax's.
        dtype = jnp.result_type(x, *leaves)
        x, w = cast(x, dtype), jax.tree.map(lambda a: cast(a, dtype), w)
    check_weights(op, x, w)
    act = _identity if activation is None else activation
    if not callable(act):
        raise TypeError(f"{op}: activation must be callable or None, got {activation!r}.")
    if (
        precision is not None
        or symbolic(x, *leaves)
        or (cfg is None and explicitly_sharded(x, *leaves))
    ):
        # A precision the tuned kernels do not promise, no shape to key by
        # (`jax.export`), or shardings in the types and no config given (an explicit
        # mesh: the kernels' rows and tiles do not carry them): plain JAX's dots.
        return cast(glu_xla(x, w, act, precision=precision), out_dtype)
    n = (w[0] if isinstance(w, tuple) else w).shape[-1]
    ex = executor if executor is not None else default_executor()
    rows = last_axis_rows(x)
    out = call_flattened(
        ex,
        kernel_for(GatedLinearUnit, ex),
        rows,
        w,
        activation=act,
        cfg=cfg,
        flattened=x.ndim > 2,
        unflattened={
            "xla": lambda: glu_xla(x, w, act),
            "xla_split": lambda: glu_xla(x, w, act, split=True),
        },
    )
    return cast(reshape(out, (*x.shape[:-1], n)), out_dtype)
