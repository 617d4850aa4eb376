"""`ragged_dot`: the public function, the forward kernel and the two backward kernels."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import keys
from kerneltune._src.execution.default import default_executor
from kerneltune._src.kernel.backends import Backend, BackendKernel
from kerneltune._src.kernel.base import Invocation
from kerneltune._src.tuning.inputs import random_like
from kerneltune.kernels._args import as_array, cast, explicitly_sharded, symbolic
from kerneltune.kernels._common import Pruned, interpreted, kernel_for
from kerneltune.kernels.ragged_dot import config as config_lib
from kerneltune.kernels.ragged_dot import groups as groups_lib
from kerneltune.kernels.ragged_dot import pallas_mosaic, tile_work, tokamax_backend
from kerneltune.kernels.ragged_dot.checks import (
    check_floats,
    check_offset,
    check_operands,
    check_pair,
    check_preferred,
    check_sizes,
    out_dtype_name,
)
from kerneltune.kernels.ragged_dot.config import XLA, Product, RaggedDotConfig, RaggedDotProblem
from kerneltune.kernels.ragged_dot.pallas_mosaic import MosaicBackend
from kerneltune.kernels.ragged_dot.pallas_triton import TritonBackend
from kerneltune.kernels.ragged_dot.reference import (
    XlaBackend,
    local_ragged_dot,
    ragged_dot_by_groups,
)
from kerneltune.kernels.ragged_dot.shapes import balanced
from kerneltune.kernels.ragged_dot.tokamax_backend import TokamaxBackend


def balanced_tuning_inputs(inv: Invocation[Any, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Random operands and a **balanced** routing (the `M` rows split evenly over the
    `G` groups) for a traced call: group sizes are data, absent from the key, so a key
    is tuned for the routing a trained router aims at. A `group_offset` call is tuned
    with the local groups in the middle (rows before and after them)."""
    a, b, sizes, *offset = inv.args
    a, b = random_like((a, b), seed=keys.seed_of(inv.call_key))
    g = int(sizes.shape[0])
    routing = jnp.asarray(balanced(int(a.shape[0]), g), jnp.int32)
    if not offset:
        return (a, b, routing), dict(inv.kwargs)
    local = int(inv.kwargs.get("local_groups") or b.shape[0])
    middle = jnp.full((1,), (g - local) // 2, jnp.int32)
    return (a, b, routing, middle), dict(inv.kwargs)


class _RaggedDotKernel(BackendKernel[RaggedDotConfig]):
    """What the three grouped-matmul kernels share: backends, problem, heuristics,
    candidates, and the balanced tuning inputs."""

    config_type = RaggedDotConfig
    product: ClassVar[Product] = "fwd"
    # tokamax has no kernels for the gradient products (it brings its own backward):
    # `RaggedDot` alone adds it.
    backends: ClassVar[tuple[Backend, ...]] = (XlaBackend(), TritonBackend(), MosaicBackend())

    def problem(self, inv: Invocation[Any, Any]) -> RaggedDotProblem:
        a, b, sizes, *offset = inv.args
        dtype = np.dtype(a.dtype)
        out = np.dtype(inv.kwargs.get("out_dtype") or dtype)
        m = int(a.shape[0])
        g = int(sizes.shape[0])
        if self.product in ("fwd", "dlhs"):  # rhs [G, K, N] (after lhs or d_out)
            k, n = int(b.shape[1]), int(b.shape[2])
        else:  # lhs [M, K], d_out [M, N]
            k, n = int(a.shape[1]), int(b.shape[1])
        local = None
        if offset:  # G_local: the experts rhs holds (d_rhs: the groups it returns)
            local = int(inv.kwargs["local_groups"] if self.product == "drhs" else b.shape[0])
        return RaggedDotProblem(self.product, m, k, n, g, dtype, out, local)

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> RaggedDotConfig:
        p = self.problem(inv)
        if self.use_interpreter():
            # Off GPUs only the interpreter runs Pallas; elsewhere XLA runs.
            return config_lib.triton_heuristic(p) if self.runs_pallas() else XLA
        # Plain `jax.lax.ragged_dot` is 16–40× slower on GPUs: never the heuristic.
        # JAX's Mosaic kernel multiplies every row of the batch wherever the groups lie:
        # with a group_offset whose local groups hold half the groups or fewer (about
        # half the rows or fewer), that is at least twice the work Triton does, which
        # skips the other rows' tiles (a structural rule, not yet measured on a GPU).
        mostly_elsewhere = p.local_g is not None and 2 * p.local_g <= p.g
        if (
            not mostly_elsewhere
            and pallas_mosaic.unsupported(self.product, p.local_g is not None) is None
        ):
            rules = config_lib.rules(p)
            for short_tiles in (True, False):  # 64x256 tiles may not fit where 128x128 do
                mosaic = config_lib.mosaic_heuristic(p, short_tiles=short_tiles)
                if all(rule(mosaic) is None for rule in rules):
                    return mosaic
        return config_lib.triton_heuristic(p)

    def search_space(
        self, inv: Invocation[Any, Any]
    ) -> tuple[list[RaggedDotConfig], list[Pruned[RaggedDotConfig]]]:
        p = self.problem(inv)
        offset = p.local_g is not None
        return config_lib.candidates(
            p,
            mosaic=pallas_mosaic.unsupported(self.product, offset),
            tokamax=tokamax_backend.unsupported(p.dtype, p.out_dtype, offset),
        )

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[RaggedDotConfig]:
        return config_lib.interpret_candidates(self.problem(inv))

    def padded_work(self, cfg: Any, sizes: Sequence[int]) -> float:
        return tile_work.padded_work(self.product, cfg, sizes)

    def config_across_sizes(self, cfg: Any, sizes: Sequence[int]) -> Any:
        return config_lib.across_sizes(self.product, cfg, sizes)

    def tuning_inputs(self, inv: Invocation[Any, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return balanced_tuning_inputs(inv)


class RaggedDot(_RaggedDotKernel):
    """The grouped matmul of mixture-of-experts layers, `jax.lax.ragged_dot`'s
    semantics: `lhs[M, K]` (rows sorted by group), `rhs[G, K, N]`, `group_sizes[G]`;
    rows after the last group give zeros. With a fourth argument, `group_offset`
    (int32 `(1,)`), `rhs` holds `G_local` of the `G` groups `group_sizes` has, and only
    the rows of groups `group_offset … group_offset + G_local − 1` are computed (with
    `rhs[g − group_offset]`); every other row is zero.

    Backends (the config's `backend`, objects in `backends`): "xla"
    (`jax.lax.ragged_dot`, the CPU path), "triton" (our Pallas grouped GEMM), "mosaic"
    (JAX's Mosaic GPU kernels, Hopper, 16-bit) and "tokamax" (`tokamax.ragged_dot`,
    where installed). The Pallas backends' gradient runs two kernels of their own,
    each tuned for itself through the kernel's executor: `RaggedDotGradLhs` (op
    "ragged_dot_dlhs") and `RaggedDotGradRhs` (op "ragged_dot_drhs"). XLA and tokamax
    bring their own backward, so a call under a gradient is keyed and tuned apart, on
    forward + backward time.

    Keys hold the shapes and dtypes (M, K, N, G, and with `group_offset` G_local and
    the offset's shape), never the group sizes: a traced call is tuned on a balanced
    routing (`balanced_tuning_inputs`); an eager call on its own arrays.

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
    backends = (*_RaggedDotKernel.backends, TokamaxBackend())

    @functools.cached_property
    def grad_lhs(self) -> RaggedDotGradLhs:
        """The d_lhs kernel, bound to this kernel's executor (and interpreter)."""
        return RaggedDotGradLhs(executor=self.executor, interpret=self.interpret)

    @functools.cached_property
    def grad_rhs(self) -> RaggedDotGradRhs:
        """The d_rhs kernel, bound to this kernel's executor (and interpreter)."""
        return RaggedDotGradRhs(executor=self.executor, interpret=self.interpret)

    def prepare(
        self, lhs: Any, rhs: Any, group_sizes: Any, group_offset: Any = None, *,
        out_dtype: Any = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:  # fmt: skip
        offset = group_offset is not None
        check_operands(self.op_id, lhs, rhs, group_sizes, offset=offset)
        check_floats(self.op_id, ("lhs", "rhs"), lhs, rhs)
        kwargs = {"out_dtype": out_dtype_name(out_dtype, lhs.dtype)}
        if not offset:
            return (lhs, rhs, group_sizes), kwargs
        g, local = int(group_sizes.shape[0]), int(rhs.shape[0])
        return (lhs, rhs, group_sizes, check_offset(self.op_id, group_offset, g, local)), kwargs

    def reference(self, lhs, rhs, group_sizes, group_offset=None, *, out_dtype: str) -> jax.Array:
        """The op's math in plain JAX, one group at a time (`ragged_dot_by_groups`: far
        less memory than `jax.lax.ragged_dot`'s): tuning checks outputs against it and
        second derivatives are taken from it."""
        return ragged_dot_by_groups(lhs, rhs, group_sizes, group_offset, out_dtype=out_dtype)


class RaggedDotGradLhs(_RaggedDotKernel):
    """d_lhs of the grouped matmul: `(d_out[M, N], rhs[G, K, N], group_sizes) ->
    d_lhs[M, K]`, each row of `d_out` times its group's `rhs[g]ᵀ` (read transposed in
    place). Rows after the last group give zeros; with a `group_offset` (a fourth
    argument, as `RaggedDot`'s), all rows outside the local groups do."""

    op_id = "ragged_dot_dlhs"
    version = "1"
    product = "dlhs"

    def prepare(
        self, dout: Any, rhs: Any, group_sizes: Any, group_offset: Any = None, *,
        out_dtype: Any = None,
    ):  # fmt: skip
        check_pair(
            self.op_id, ("d_out", "rhs"), dout, rhs,
            ndims=(2, 3), layouts="[M, N] and [G, K, N]", axes=(1, 2), agree="agree on N",
        )  # fmt: skip
        local = int(rhs.shape[0])
        check_sizes(self.op_id, group_sizes, None if group_offset is not None else local)
        check_floats(self.op_id, ("d_out", "rhs"), dout, rhs)
        kwargs = {"out_dtype": out_dtype_name(out_dtype, rhs.dtype)}
        if group_offset is None:
            return (dout, rhs, group_sizes), kwargs
        groups_lib.check_local(self.op_id, group_sizes, local)
        offset = check_offset(self.op_id, group_offset, int(group_sizes.shape[0]), local)
        return (dout, rhs, group_sizes, offset), kwargs


class RaggedDotGradRhs(_RaggedDotKernel):
    """d_rhs of the grouped matmul: `(lhs[M, K], d_out[M, N], group_sizes) ->
    d_rhs[G, K, N]`, `lhs[rows of g]ᵀ · d_out[rows of g]` per group (zero for an empty
    group; rows after the last group are not read). With a `group_offset` (a fourth
    argument) and `local_groups=G_local`, the `[G_local, K, N]` slices of the groups
    from the offset on (the other rows are not read)."""

    op_id = "ragged_dot_drhs"
    version = "1"
    product = "drhs"

    def prepare(
        self, lhs: Any, dout: Any, group_sizes: Any, group_offset: Any = None, *,
        out_dtype: Any = None, local_groups: int | None = None,
    ):  # fmt: skip
        check_pair(
            self.op_id, ("lhs", "d_out"), lhs, dout,
            ndims=(2, 2), layouts="2-D [M, K] and [M, N]", axes=(0, 0), agree="have the same rows",
        )  # fmt: skip
        check_sizes(self.op_id, group_sizes, None)
        check_floats(self.op_id, ("lhs", "d_out"), lhs, dout)
        kwargs: dict[str, Any] = {"out_dtype": out_dtype_name(out_dtype, lhs.dtype)}
        if group_offset is None:
            if local_groups is not None:
                raise ValueError(
                    f"{self.op_id}: local_groups={local_groups!r} is for a call with a "
                    "group_offset; pass both or neither."
                )
            return (lhs, dout, group_sizes), kwargs
        g = int(group_sizes.shape[0])
        if isinstance(local_groups, bool) or not isinstance(local_groups, (int, np.integer)):
            raise TypeError(
                f"{self.op_id}: with a group_offset, local_groups must be the int G_local "
                f"(the groups d_rhs holds), got {local_groups!r}."
            )
        if not 1 <= local_groups <= g:
            raise ValueError(
                f"{self.op_id}: local_groups must lie in [1, G] = [1, {g}], got {local_groups}."
            )
        kwargs["local_groups"] = int(local_groups)
        offset = check_offset(self.op_id, group_offset, g, int(local_groups))
        return (lhs, dout, group_sizes, offset), kwargs


#: The kernels run in the Pallas interpreter (kept names: tests and the CPU demo).
RaggedDotInterpret = interpreted(RaggedDot)
RaggedDotGradLhsInterpret = interpreted(RaggedDotGradLhs)
RaggedDotGradRhsInterpret = interpreted(RaggedDotGradRhs)


def ragged_dot(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    precision: Any = None,
    preferred_element_type: Any = None,
    group_offset: jax.Array | int | None = None,
    out_sharding: Any = None,
    *,
    reduction_order: Any = None,
    activation: Callable[[jax.Array], jax.Array] | None = None,
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

    With `group_offset` (expert parallelism, `jax.lax.ragged_dot_general`'s meaning):
    `rhs` holds `G_local` experts and `group_sizes` all `G` groups of a globally sorted
    batch; the rows of groups `group_offset … group_offset + G_local − 1` are multiplied
    by `rhs[g − group_offset]` and every other row of the output is zero, as are their
    gradients. Under `shard_map` the offset is typically `jax.lax.axis_index(axis) *
    G_local`. The Pallas kernels skip the tiles outside the local rows (they only store
    their zeros), so a call costs about what the renumbered local groups cost.
    (`jax.lax.ragged_dot` and tokamax raise NotImplementedError for any
    `group_offset`; tokamax is not offered for such calls.)

    Configs are keyed by shapes and dtypes only (group sizes are data): a call traced
    under `jit` is tuned on a balanced routing, its rows split evenly over the groups.

    Args:
      lhs: `[M, K]`.
      rhs: `[G, K, N]`, or `[G_local, K, N]` with `group_offset`.
      group_sizes: `[G]` integers summing to at most `M`.
      precision, preferred_element_type: as `jax.lax.ragged_dot` (positional there
        too, as are `group_offset` and `out_sharding`).
      group_offset: None, or the first group `rhs` holds: an int or an integer array
        of shape `()` or `(1,)` in `[0, G − G_local]` (it may be traced; a traced value
        outside that range is clipped into it).
      out_sharding: None, or the output's sharding under an explicit mesh, as
        `jax.lax.ragged_dot`'s (such a call runs `jax.lax.ragged_dot`).
      reduction_order: None, or as `jax.lax.ragged_dot`'s where the installed JAX has
        it (0.12 and later; such a call runs `jax.lax.ragged_dot`).
      activation: None, or a function applied to the product (every row, the zero
        ones too) in the accumulator's dtype (float32 for 16-bit floats) before the
        cast to the output dtype: tokamax's argument.
      cfg: a `RaggedDotConfig` to use instead of the chosen forward config.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Returns:
      `[M, N]` in `preferred_element_type`, else the inputs' dtype.

    Raises:
      ShapeMismatch: (a ValueError and a TypeError, as JAX's is a TypeError) shapes
        that do not fit one another.
      ValueError: a concrete `group_offset` out of range, or of another shape.
      TypeError: a non-integer `group_sizes` or `group_offset`, or a non-array argument.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import ragged_dot
      >>> out = ragged_dot(jnp.ones((5, 4)), jnp.ones((2, 4, 3)), jnp.array([2, 2]))
      >>> out[:, 0].tolist()
      [4.0, 4.0, 4.0, 4.0, 0.0]
      >>> # Groups 1 and 2 of three (rows 2-4), on the two experts this device holds:
      >>> local = ragged_dot(jnp.ones((6, 4)), jnp.ones((2, 4, 3)), jnp.array([2, 1, 2]),
      ...                    group_offset=1)
      >>> local[:, 0].tolist()
      [0.0, 0.0, 4.0, 4.0, 4.0, 0.0]
    """
    op = "ragged_dot"
    if activation is not None:
        if not callable(activation):
            raise TypeError(f"{op}: activation must be callable or None, got {activation!r:.60}.")
        # The output dtype is a dot's of the operands' dtypes (shapes checked below).
        a, b = (as_array(op, n, v) for n, v in (("lhs", lhs), ("rhs", rhs)))
        one = [jax.ShapeDtypeStruct((1, 1), d.dtype) for d in (a, b)]
        preferred = check_preferred(op, preferred_element_type)
        dot = functools.partial(jax.lax.dot, preferred_element_type=preferred)
        out = jax.eval_shape(dot, *one)
        narrow = jnp.issubdtype(out.dtype, jnp.floating) and out.dtype.itemsize < 4
        acc = ragged_dot(
            a, b, group_sizes, precision, jnp.float32 if narrow else out.dtype, group_offset,
            out_sharding, reduction_order=reduction_order, cfg=cfg, executor=executor,
        )  # fmt: skip
        return activation(acc).astype(out.dtype)  # type: ignore[no-any-return]
    lhs = as_array(op, "lhs", lhs)
    rhs = as_array(op, "rhs", rhs)
    sizes = as_array(op, "group_sizes", group_sizes)
    local = group_offset is not None
    check_operands(op, lhs, rhs, sizes, offset=local)
    offset = (
        check_offset(op, group_offset, int(sizes.shape[0]), int(rhs.shape[0])) if local else None
    )
    preferred = check_preferred(op, preferred_element_type)
    dtype = np.dtype(lhs.dtype)
    tunable = (
        not symbolic(lhs, rhs)  # `jax.export`'s polymorphic shapes: no shape to key by
        and dtype == np.dtype(rhs.dtype)
        and jnp.issubdtype(dtype, jnp.floating)
        and precision is None
        and out_sharding is None  # (explicit meshes: JAX's own sharding rule)
        and reduction_order is None
        # Arrays sharded over explicit mesh axes: the kernels cannot carry the types (a
        # Pallas call refuses them); JAX's op takes them, or says it needs out_sharding.
        and not (cfg is None and explicitly_sharded(lhs, rhs, sizes, offset))
        and preferred in (None, dtype, np.dtype(np.float32))
        and min(lhs.shape[0], lhs.shape[1], rhs.shape[0], rhs.shape[2]) > 0
    )
    if not tunable:  # what `jax.lax.ragged_dot` computes, on the local rows with an offset
        # Only the options given are passed: a JAX without `reduction_order` refuses it.
        extra = {"out_sharding": out_sharding, "reduction_order": reduction_order}
        return local_ragged_dot(
            lhs,
            rhs,
            sizes,
            offset,
            precision=precision,
            preferred_element_type=preferred_element_type,
            **{name: value for name, value in extra.items() if value is not None},
        )
    ex = executor if executor is not None else default_executor()
    out_dtype = (dtype if preferred is None else preferred).name
    args = (lhs, rhs, cast(sizes, np.dtype(np.int32))) + (() if offset is None else (offset,))
    return ex(kernel_for(RaggedDot, ex), *args, out_dtype=out_dtype, cfg=cfg)
