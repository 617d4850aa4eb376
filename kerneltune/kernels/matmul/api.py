"""`matmul`: the public function and its kernel."""

from __future__ import annotations

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
    check_contracted,
    explicitly_sharded,
    last_axis_rows,
    reshape,
)
from kerneltune.kernels._common import Pruned, interpreted, is_hopper, kernel_for
from kerneltune.kernels._flattened import call_flattened
from kerneltune.kernels.matmul import config as config_lib
from kerneltune.kernels.matmul import mosaic_space, pallas_mosaic
from kerneltune.kernels.matmul.config import MatmulConfig, MatmulProblem
from kerneltune.kernels.matmul.pallas_mosaic import MosaicBackend
from kerneltune.kernels.matmul.pallas_triton import TritonBackend
from kerneltune.kernels.matmul.reference import XlaBackend, matmul_xla

#: `jnp.dot` through XLA: cuBLAS on GPUs.
XLA = MatmulConfig(backend="xla")


def problem_of(inv: Invocation[Any, Any]) -> MatmulProblem:
    x, y = inv.args[0], inv.args[1]
    return MatmulProblem(
        m=int(x.shape[0]), n=int(y.shape[1]), k=int(x.shape[1]), dtype=np.dtype(x.dtype)
    )


class Matmul(BackendKernel[MatmulConfig]):
    """`x[m, k] @ y[k, n]`: our Pallas tiled matmul on GPUs (Triton), `jnp.dot` on
    CPUs. On Hopper GPUs with 16-bit inputs the candidates also include JAX's Mosaic
    GPU Hopper matmul (`MatmulConfig(backend="mosaic")`), so tuning picks the faster
    backend per shape; the untuned config is XLA's (cuBLAS). The Pallas backends'
    gradient runs the same kernel on the transposed problems, each tuned for its own
    shapes.

    Args:
      op_id: the op id (default "matmul").
      executor: the executor the backward pass's matmuls run through (default: the
        default executor).
      interpret: run the Pallas code in the Pallas interpreter (tests, the CPU demo).
    """

    op_id = "matmul"
    # 2: configs gained a backend and the Mosaic GPU fields; 3: the XLA backend.
    version = "3"
    config_type = MatmulConfig
    backends = (XlaBackend(), TritonBackend(), MosaicBackend())

    def prepare(self, x: Any, y: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if getattr(x, "ndim", None) != 2 or getattr(y, "ndim", None) != 2:
            raise ValueError(
                f"{self.op_id} takes 2-D x and y, got shapes {getattr(x, 'shape', x)} and "
                f"{getattr(y, 'shape', y)} (the `matmul` function flattens leading dims)."
            )
        check_contracted(self.op_id, ("x", "y"), x, y, (1, 0))
        if np.dtype(x.dtype) != np.dtype(y.dtype):
            raise TypeError(
                f"{self.op_id}: x and y must have the same dtype, got {x.dtype} and {y.dtype}."
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{self.op_id} takes floating-point inputs, got {x.dtype}.")
        return (x, y), {}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> MatmulConfig:
        # The interpreter runs our tiles; on GPUs cuBLAS (through XLA) is what an
        # untuned call must not lose to; elsewhere XLA runs.
        if self.runs_pallas() and self.use_interpreter():
            return config_lib.heuristic(problem_of(inv))
        return XLA

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[MatmulConfig]:
        return config_lib.interpret_candidates(problem_of(inv))

    def search_space(
        self, inv: Invocation[Any, Any]
    ) -> tuple[list[MatmulConfig], list[Pruned[MatmulConfig]]]:
        p = problem_of(inv)
        if mosaic_space.offered(p, hopper=is_hopper()):
            kept, pruned = mosaic_space.candidates_with_mosaic(p, support=pallas_mosaic.support())
        else:
            kept, pruned = config_lib.candidates(p)
        return [XLA, *kept], pruned

    def reference(self, x: jax.Array, y: jax.Array) -> jax.Array:
        """The op's math in plain JAX: second derivatives are taken from it."""
        return matmul_xla(x, y)


#: `Matmul` run by the Pallas interpreter on any device, with a few tile shapes as
#: candidates: for tests and the CPU demo (its timings measure the interpreter).
MatmulInterpret = interpreted(Matmul)


def matmul(
    a: jax.Array,
    b: jax.Array,
    *,
    precision: Any = None,
    preferred_element_type: Any = None,
    out_sharding: Any = None,
    reduction_order: Any = None,
    cfg: MatmulConfig | None = None,
    executor: Any = None,
) -> jax.Array:
    """`jnp.matmul` with a tuned config: same shapes, broadcasting and dtype promotion.

    A floating `[..., m, k] @ [k, n]` product (the projections of a model) runs
    through the tuned kernel: our Pallas kernel on GPUs, or JAX's Mosaic GPU matmul
    where it wins on a Hopper GPU, `jnp.dot` on CPUs. Every other call (vectors, a
    batched right operand, integers, float64, two weakly typed operands, an explicit
    `precision`, `preferred_element_type`, `out_sharding` or `reduction_order`, and
    given no `cfg` operands sharded over explicit mesh axes) computes exactly what
    `jnp.matmul` computes, through XLA.

    Args:
      a: `[..., m, k]` or `[k]`.
      b: `[..., k, n]` or `[k]`.
      precision, preferred_element_type, out_sharding: as `jnp.matmul`.
      reduction_order: as `jnp.matmul` where the installed JAX has it (0.11 and later);
        an older `jnp.matmul` refuses it, and so does this function.
      cfg: a `MatmulConfig` to use instead of the chosen one.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import matmul
      >>> matmul(jnp.ones((2, 3, 4)), jnp.ones((4, 5))).shape
      (2, 3, 5)
      >>> matmul(jnp.ones(4), jnp.ones(4)).tolist()
      4.0
    """
    op = "matmul"
    a, b = as_array(op, "a", a), as_array(op, "b", b)
    if a.ndim < 1 or b.ndim < 1:
        raise ValueError(
            f"{op}: a and b must have at least one dimension, got shapes {a.shape} and {b.shape}."
        )
    dtype = jnp.result_type(a, b)  # first, as jnp.matmul promotes before it multiplies
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k_a != k_b:  # a TypeError, as jnp.matmul's (from lax.dot_general), and a ValueError
        raise ShapeMismatch(
            f"{op}: a's last dimension ({k_a}) must equal b's "
            f"{'only' if b.ndim == 1 else 'second-to-last'} dimension ({k_b}); "
            f"got shapes {a.shape} and {b.shape}."
        )
    # jnp.matmul's product of two weakly typed operands (`jnp.full(s, 0.5)`) is weakly
    # typed, which decides how it promotes later; the kernels' products are not.
    weak = jax.typeof(a).weak_type and jax.typeof(b).weak_type
    tunable = (
        a.ndim >= 2
        and b.ndim == 2
        and jnp.issubdtype(dtype, jnp.floating)
        and dtype != jnp.float64  # the kernels accumulate in float32
        and precision is None
        and preferred_element_type in (None, dtype)
        and out_sharding is None
        and reduction_order is None
        and not weak
        # Sharding in types (an explicit mesh): the kernels' rows and tiles do not
        # carry it (a Pallas call refuses it); JAX's own product does.
        and not (cfg is None and explicitly_sharded(a, b))
    )
    if not tunable:
        # Only the options given are passed: a JAX without `reduction_order` refuses it.
        extra = {"out_sharding": out_sharding, "reduction_order": reduction_order}
        given = {name: value for name, value in extra.items() if value is not None}
        return jnp.matmul(
            a, b, precision=precision, preferred_element_type=preferred_element_type, **given
        )
    ex = executor if executor is not None else default_executor()
    a2, b2 = last_axis_rows(cast(a, dtype)), cast(b, dtype)
    out = call_flattened(
        ex,
        kernel_for(Matmul, ex),
        a2,
        b2,
        cfg=cfg,
        flattened=a.ndim > 2,
        unflattened={"xla": lambda: jnp.matmul(a.astype(dtype), b2)},
    )
    shape = (*a.shape[:-1], b.shape[-1])
    return reshape(out, shape)
