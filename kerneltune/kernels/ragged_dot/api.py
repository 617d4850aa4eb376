"""`ragged_dot`: the public function, the forward kernel and the two backward kernels."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import keys
from kerneltune._src.execution.default import default_executor
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import Invocation
from kerneltune._src.tuning.inputs import random_like
from kerneltune.kernels._args import as_array
from kerneltune.kernels._common import Pruned, interpreted, kernel_for
from kerneltune.kernels.ragged_dot import config as config_lib
from kerneltune.kernels.ragged_dot import pallas_mosaic, tokamax_backend
from kerneltune.kernels.ragged_dot.config import XLA, Product, RaggedDotConfig, RaggedDotProblem
from kerneltune.kernels.ragged_dot.pallas_mosaic import MosaicBackend
from kerneltune.kernels.ragged_dot.pallas_triton import TritonBackend
from kerneltune.kernels.ragged_dot.reference import XlaBackend, ragged_dot_xla
from kerneltune.kernels.ragged_dot.shapes import balanced
from kerneltune.kernels.ragged_dot.tokamax_backend import TokamaxBackend


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in getattr(x, "shape", ()))


def check_operands(op: str, names: tuple[str, str, str], a: Any, b: Any, sizes: Any) -> None:
    """`a[M, K]`, `b[G, K, N]` and `sizes[G]` fit one another (for the backward kernels,
    `names` says what the operands are called there)."""
    na, nb, ns = names
    if getattr(a, "ndim", None) != 2:
        raise ValueError(f"{op}: {na} must be 2-D [M, K], got shape {_shape(a)}.")
    if getattr(b, "ndim", None) != 3:
        raise ValueError(f"{op}: {nb} must be 3-D [G, K, N], got shape {_shape(b)}.")
    if getattr(sizes, "ndim", None) != 1 or sizes.shape[0] != b.shape[0]:
        raise ValueError(
            f"{op}: {ns} must be 1-D [G] with G = {nb}.shape[0] = {b.shape[0]}, got shape "
            f"{_shape(sizes)}."
        )
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{op}: {na} is {_shape(a)} and {nb} is {_shape(b)}; {na}.shape[1] must equal "
            f"{nb}.shape[1] (K)."
        )
    if not jnp.issubdtype(sizes.dtype, jnp.integer):
        raise TypeError(f"{op}: {ns} must have an integer dtype, got {sizes.dtype}.")


def _check_sizes(op: str, sizes: Any, groups: int | None) -> None:
    if getattr(sizes, "ndim", None) != 1 or (groups is not None and sizes.shape[0] != groups):
        want = "[G]" if groups is None else f"[{groups}]"
        raise ValueError(f"{op}: group_sizes must be 1-D {want}, got shape {_shape(sizes)}.")
    if not jnp.issubdtype(sizes.dtype, jnp.integer):
        raise TypeError(f"{op}: group_sizes must have an integer dtype, got {sizes.dtype}.")


def _check_floats(op: str, names: tuple[str, str], a: Any, b: Any) -> None:
    if np.dtype(a.dtype) != np.dtype(b.dtype) or not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(
            f"{op}: {names[0]} and {names[1]} must share one floating dtype, got "
            f"{a.dtype} and {b.dtype}."
        )


def _out_dtype(out_dtype: Any, default: Any) -> str:
    return np.dtype(default if out_dtype is None else out_dtype).name


def balanced_tuning_inputs(inv: Invocation[Any, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Random operands and a **balanced** routing (the `M` rows split evenly over the
    `G` groups) for a traced call: group sizes are data, absent from the key, so a key
    is tuned for the routing a trained router aims at."""
    a, b, sizes = inv.args
    a, b = random_like((a, b), seed=keys.seed_of(inv.call_key))
    routing = jnp.asarray(balanced(int(a.shape[0]), int(sizes.shape[0])), jnp.int32)
    return (a, b, routing), dict(inv.kwargs)


class _RaggedDotKernel(BackendKernel[RaggedDotConfig]):
    """What the three grouped-matmul kernels share: problem, heuristics, candidates,
    and the balanced tuning inputs."""

    config_type = RaggedDotConfig
    product: ClassVar[Product] = "fwd"
    #: How the kernel's operands are called in its error messages.
    operand_names: ClassVar[tuple[str, str, str]] = ("lhs", "rhs", "group_sizes")

    def problem(self, inv: Invocation[Any, Any]) -> RaggedDotProblem:
        a, b, sizes = inv.args
        dtype = np.dtype(a.dtype)
        out = np.dtype(inv.kwargs.get("out_dtype") or dtype)
        m = int(a.shape[0])
        g = int(sizes.shape[0])
        if self.product == "fwd":  # lhs [M, K], rhs [G, K, N]
            k, n = int(b.shape[1]), int(b.shape[2])
        elif self.product == "dlhs":  # d_out [M, N], rhs [G, K, N]
            k, n = int(b.shape[1]), int(b.shape[2])
        else:  # lhs [M, K], d_out [M, N]
            k, n = int(a.shape[1]), int(b.shape[1])
        return RaggedDotProblem(self.product, m, k, n, g, dtype, out)

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> RaggedDotConfig:
        p = self.problem(inv)
        if self.use_interpreter():
            # Off GPUs only the interpreter runs Pallas; elsewhere XLA runs.
            return config_lib.triton_heuristic(p) if self.runs_pallas() else XLA
        # Plain `jax.lax.ragged_dot` is 16–40× slower on GPUs: never the heuristic.
        if pallas_mosaic.unsupported(self.product) is None:
            mosaic = config_lib.mosaic_heuristic(p)
            if all(rule(mosaic) is None for rule in config_lib.rules(p)):
                return mosaic
        return config_lib.triton_heuristic(p)

    def search_space(
        self, inv: Invocation[Any, Any]
    ) -> tuple[list[RaggedDotConfig], list[Pruned[RaggedDotConfig]]]:
        p = self.problem(inv)
        return config_lib.candidates(
            p,
            mosaic=pallas_mosaic.unsupported(self.product),
            tokamax=tokamax_backend.unsupported(p.dtype, p.out_dtype),
        )

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[RaggedDotConfig]:
        return config_lib.interpret_candidates(self.problem(inv))

    def tuning_inputs(self, inv: Invocation[Any, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return balanced_tuning_inputs(inv)


class RaggedDot(_RaggedDotKernel):
    """The grouped matmul of mixture-of-experts layers, `jax.lax.ragged_dot`'s
    semantics: `lhs[M, K]` (rows sorted by group), `rhs[G, K, N]`, `group_sizes[G]`;
    rows after the last group give zeros.

    Backends (the config's `backend`, objects in `backends`): "xla"
    (`jax.lax.ragged_dot`, the CPU path), "triton" (our Pallas grouped GEMM), "mosaic"
    (JAX's Mosaic GPU kernels, Hopper, 16-bit) and "tokamax" (`tokamax.ragged_dot`,
    where installed). The Pallas backends' gradient runs two kernels of their own,
    each tuned for itself through the kernel's executor: `RaggedDotGradLhs` (op
    "ragged_dot_dlhs") and `RaggedDotGradRhs` (op "ragged_dot_drhs"). XLA and tokamax
    bring their own backward, so a call under a gradient is keyed and tuned apart, on
    forward + backward time.

    Keys hold the shapes and dtypes (M, K, N, G), never the group sizes: a traced call
    is tuned on a balanced routing (`balanced_tuning_inputs`); an eager call on its
    own arrays.

    Args:
      op_id: the op id (default "ragged_dot").
      executor: the executor the backward kernels run through (default: the default
        executor).
      interpret: run the Pallas code in the Pallas interpreter (tests, the CPU demo).
    """

    op_id = "ragged_dot"
    version = "1"
    product = "fwd"
    tunes_training_apart = True
    backends = (XlaBackend(), TritonBackend(), MosaicBackend(), TokamaxBackend())

    @functools.cached_property
    def grad_lhs(self) -> RaggedDotGradLhs:
        """The d_lhs kernel, bound to this kernel's executor (and interpreter)."""
        return RaggedDotGradLhs(executor=self.executor, interpret=self.interpret)

    @functools.cached_property
    def grad_rhs(self) -> RaggedDotGradRhs:
        """The d_rhs kernel, bound to this kernel's executor (and interpreter)."""
        return RaggedDotGradRhs(executor=self.executor, interpret=self.interpret)

    def prepare(
        self, lhs: Any, rhs: Any, group_sizes: Any, *, out_dtype: Any = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        check_operands(self.op_id, self.operand_names, lhs, rhs, group_sizes)
        _check_floats(self.op_id, ("lhs", "rhs"), lhs, rhs)
        return (lhs, rhs, group_sizes), {"out_dtype": _out_dtype(out_dtype, lhs.dtype)}

    def reference(self, lhs, rhs, group_sizes, *, out_dtype: str) -> jax.Array:
        """The op's math in plain JAX: second derivatives are taken from it."""
        return ragged_dot_xla(lhs, rhs, group_sizes, out_dtype=out_dtype)


class RaggedDotGradLhs(_RaggedDotKernel):
    """d_lhs of the grouped matmul: `(d_out[M, N], rhs[G, K, N], group_sizes) ->
    d_lhs[M, K]`, each row of `d_out` times its group's `rhs[g]ᵀ` (read transposed in
    place). Rows after the last group give zeros."""

    op_id = "ragged_dot_dlhs"
    version = "1"
    product = "dlhs"
    operand_names = ("d_out", "rhs", "group_sizes")
    backends = (XlaBackend(), TritonBackend(), MosaicBackend())

    def prepare(self, dout: Any, rhs: Any, group_sizes: Any, *, out_dtype: Any = None):
        if getattr(dout, "ndim", None) != 2 or getattr(rhs, "ndim", None) != 3:
            raise ValueError(
                f"{self.op_id}: d_out and rhs must be [M, N] and [G, K, N], got shapes "
                f"{_shape(dout)} and {_shape(rhs)}."
            )
        if dout.shape[1] != rhs.shape[2]:
            raise ValueError(
                f"{self.op_id}: d_out {_shape(dout)} and rhs {_shape(rhs)} must agree on N."
            )
        _check_sizes(self.op_id, group_sizes, int(rhs.shape[0]))
        _check_floats(self.op_id, ("d_out", "rhs"), dout, rhs)
        return (dout, rhs, group_sizes), {"out_dtype": _out_dtype(out_dtype, rhs.dtype)}


class RaggedDotGradRhs(_RaggedDotKernel):
    """d_rhs of the grouped matmul: `(lhs[M, K], d_out[M, N], group_sizes) ->
    d_rhs[G, K, N]`, `lhs[rows of g]ᵀ · d_out[rows of g]` per group (zero for an empty
    group; rows after the last group are not read)."""

    op_id = "ragged_dot_drhs"
    version = "1"
    product = "drhs"
    operand_names = ("lhs", "d_out", "group_sizes")
    backends = (XlaBackend(), TritonBackend(), MosaicBackend())

    def prepare(self, lhs: Any, dout: Any, group_sizes: Any, *, out_dtype: Any = None):
        if getattr(lhs, "ndim", None) != 2 or getattr(dout, "ndim", None) != 2:
            raise ValueError(
                f"{self.op_id}: lhs and d_out must be 2-D [M, K] and [M, N], got shapes "
                f"{_shape(lhs)} and {_shape(dout)}."
            )
        if lhs.shape[0] != dout.shape[0]:
            raise ValueError(
                f"{self.op_id}: lhs {_shape(lhs)} and d_out {_shape(dout)} must have the same rows."
            )
        _check_sizes(self.op_id, group_sizes, None)
        _check_floats(self.op_id, ("lhs", "d_out"), lhs, dout)
        return (lhs, dout, group_sizes), {"out_dtype": _out_dtype(out_dtype, lhs.dtype)}


#: The kernels run in the Pallas interpreter (kept names: tests and the CPU demo).
RaggedDotInterpret = interpreted(RaggedDot)
RaggedDotGradLhsInterpret = interpreted(RaggedDotGradLhs)
RaggedDotGradRhsInterpret = interpreted(RaggedDotGradRhs)


def _preferred(op: str, value: Any) -> np.dtype | None:
    if value is None:
        return None
    try:
        return np.dtype(value)
    except TypeError as e:
        raise TypeError(
            f"{op}: preferred_element_type must be None or a dtype, got {value!r}."
        ) from e


def ragged_dot(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    precision: Any = None,
    preferred_element_type: Any = None,
    group_offset: jax.Array | None = None,
    cfg: RaggedDotConfig | None = None,
    executor: Any = None,
) -> jax.Array:
    """`jax.lax.ragged_dot` with tuned configs: the grouped matmul of
    mixture-of-experts layers.

    Rows of `lhs` are sorted by group: the first `group_sizes[0]` rows are multiplied
    by `rhs[0]`, the next `group_sizes[1]` by `rhs[1]`, and so on; rows after the last
    group give zeros. A floating call with one dtype, no `precision` and an output in
    the inputs' dtype or float32 runs through the tuned kernels (on GPUs JAX's Mosaic
    kernels on Hopper, our Pallas kernel elsewhere, tokamax's where tuning finds it
    faster; `jax.lax.ragged_dot` on CPUs), its gradient too. Every other call computes
    exactly what `jax.lax.ragged_dot` computes.

    Configs are keyed by shapes and dtypes only (group sizes are data): a call traced
    under `jit` is tuned on a balanced routing, its rows split evenly over the groups.

    Args:
      lhs: `[M, K]`.
      rhs: `[G, K, N]`.
      group_sizes: `[G]` integers summing to at most `M`.
      precision, preferred_element_type: as `jax.lax.ragged_dot`.
      group_offset: not supported, as by `jax.lax.ragged_dot` (it raises
        NotImplementedError for any value on CPUs and GPUs).
      cfg: a `RaggedDotConfig` to use instead of the chosen forward config.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Returns:
      `[M, N]` in `preferred_element_type`, else the inputs' dtype.

    Raises:
      ValueError: shapes that do not fit one another.
      TypeError: a non-integer `group_sizes`, or a non-array argument.
      NotImplementedError: a `group_offset`.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import ragged_dot
      >>> out = ragged_dot(jnp.ones((5, 4)), jnp.ones((2, 4, 3)), jnp.array([2, 2]))
      >>> out[:, 0].tolist()
      [4.0, 4.0, 4.0, 4.0, 0.0]
    """
    op = "ragged_dot"
    lhs = as_array(op, "lhs", lhs)
    rhs = as_array(op, "rhs", rhs)
    sizes = as_array(op, "group_sizes", group_sizes)
    check_operands(op, ("lhs", "rhs", "group_sizes"), lhs, rhs, sizes)
    if group_offset is not None:
        raise NotImplementedError(
            f"{op}: group_offset is not supported (got {group_offset!r}): jax.lax.ragged_dot "
            "raises NotImplementedError for any group_offset on CPUs and GPUs; pass None."
        )
    preferred = _preferred(op, preferred_element_type)
    dtype = np.dtype(lhs.dtype)
    tunable = (
        dtype == np.dtype(rhs.dtype)
        and jnp.issubdtype(dtype, jnp.floating)
        and precision is None
        and preferred in (None, dtype, np.dtype(np.float32))
        and min(lhs.shape[0], lhs.shape[1], rhs.shape[0], rhs.shape[2]) > 0
    )
    if not tunable:
        return jax.lax.ragged_dot(
            lhs, rhs, sizes, precision=precision, preferred_element_type=preferred_element_type
        )
    ex = executor if executor is not None else default_executor()
    out_dtype = (dtype if preferred is None else preferred).name
    return ex(
        kernel_for(RaggedDot, ex), lhs, rhs, sizes.astype(jnp.int32), out_dtype=out_dtype, cfg=cfg
    )
