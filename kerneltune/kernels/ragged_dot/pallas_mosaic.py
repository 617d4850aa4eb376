"""JAX's Mosaic GPU grouped matmuls for Hopper as a backend of all three products.

`jax.experimental.pallas.ops.gpu.ragged_dot_mgpu.ragged_dot(lhs, rhs, *, group_sizes,
block_m, block_n, block_k, max_concurrent_steps, grid_block_n, transpose_rhs=False)`
runs the forward and, with `transpose_rhs=True` on `(d_out, rhs)`, d_lhs;
`transposed_ragged_dot_mgpu.transposed_ragged_dot(lhs, rhs, *, group_sizes, block_m,
block_n, block_k, max_concurrent_steps, grid_block_n)` runs d_rhs (its ragged axis is
the first, and contracted). Both take float16 or bfloat16 and write the inputs' dtype.

The modules are experimental: kerneltune reads their signatures once per process and
offers no Mosaic config (each pruned with the reason) where a module does not import,
lacks the function, or wants parameters kerneltune does not pass. The signatures
above are those of jax 0.10.2 and 0.12.0 (read from their sources).

`group_offset` (expert parallelism). Neither function takes a first row: each computes
its groups from row 0. JAX's forward kernel computes every row tile of its grid
(`cdiv(M, block_m) + G − 1` tiles), those past the last group included (they redo tile
0 and store nothing), so its work does not depend on where the groups lie. A call with
`group_offset` gives it the local groups with the rows before them added to the first
and the rows after them to the last (the same `G_local` groups and grid as the
renumbered call), then zeroes the rows outside the local groups, as the renumbered
call zeroes those after its last group: the same matrix work, plus the stores of the
rows outside. The forward and d_lhs run that way. JAX's transposed kernel (d_rhs)
walks each group's rows, so the same trick would multiply every row of the batch:
d_rhs with `group_offset` is left to the Triton kernel (pruned here, with that reason).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from kerneltune.kernels._common import device_kind_name, is_hopper, jax_gpu_op, logger
from kerneltune.kernels.ragged_dot import groups as groups_lib
from kerneltune.kernels.ragged_dot.config import RaggedDotConfig
from kerneltune.kernels.ragged_dot.pallas_backward import PallasGradient
from kerneltune.kernels.ragged_dot.reference import rows_after_groups_zeroed

FORWARD = ("ragged_dot_mgpu", "ragged_dot")
TRANSPOSED = ("transposed_ragged_dot_mgpu", "transposed_ragged_dot")
#: The keyword parameters kerneltune passes to both functions.
PARAMS = frozenset(
    {"group_sizes", "block_m", "block_n", "block_k", "max_concurrent_steps", "grid_block_n"}
)


@dataclasses.dataclass(frozen=True)
class MosaicFunction:
    """One of JAX's Mosaic grouped matmuls, or why it cannot be used."""

    fn: Any = None
    reason: str | None = None
    params: frozenset[str] = frozenset()


def inspect_function(fn: Any, where: str, *, needs: frozenset[str] = PARAMS) -> MosaicFunction:
    """`fn` if it takes every parameter in `needs` and requires nothing else beyond
    its two positional operands; else the reason it cannot be used."""
    if not callable(fn):
        return MosaicFunction(reason=f"{where} is missing")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return MosaicFunction(reason=f"the signature of {where} cannot be read")
    missing = sorted(needs - set(params))
    if missing:
        return MosaicFunction(reason=f"{where} takes no {missing} (its parameters: {list(params)})")
    extra = [
        name
        for name, p in list(params.items())[2:]
        if name not in needs
        and p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if extra:
        return MosaicFunction(
            reason=f"{where} also requires {extra}, which kerneltune does not pass"
        )
    return MosaicFunction(fn=fn, params=frozenset(params))


@functools.cache
def _load(module_name: str, attr: str) -> MosaicFunction:
    where = f"jax.experimental.pallas.ops.gpu.{module_name}.{attr}"
    try:
        module = jax_gpu_op(module_name)
    except Exception as e:  # an ImportError, or any error inside an experimental module
        found = MosaicFunction(
            reason=f"`import {where.rsplit('.', 1)[0]}` failed ({type(e).__name__}: {e})"
        )
    else:
        found = inspect_function(getattr(module, attr, None), where)
    if found.reason is not None:
        logger.info("ragged_dot's Mosaic GPU backend is off: %s", found.reason)
    return found


#: Why the Mosaic backend does not run d_rhs with a `group_offset`.
NO_OFFSET_DRHS = (
    "JAX's transposed Mosaic kernel (d_rhs) has no first row: with group_offset it would "
    "multiply the rows of every group, so d_rhs with group_offset runs on Triton"
)


def unsupported(product: str, offset: bool = False) -> str | None:
    """Why Mosaic configs cannot run `product` here ("fwd", "dlhs", "drhs"; `offset`:
    with a `group_offset`), or None."""
    if not is_hopper():
        return "JAX's Mosaic GPU ragged_dot kernels run on Hopper GPUs (H100, H200) only"
    if offset and product == "drhs":
        return NO_OFFSET_DRHS
    found = _load(*(TRANSPOSED if product == "drhs" else FORWARD))
    if found.reason is not None:
        return found.reason
    if product == "dlhs" and "transpose_rhs" not in found.params:
        return "this JAX's ragged_dot_mgpu.ragged_dot takes no transpose_rhs (needed for d_lhs)"
    return None


@functools.lru_cache(maxsize=256)  # a tuning builds one a config: keep the recent ones
def _jitted(fn: Callable[..., jax.Array], cfg: RaggedDotConfig, **extra: Any) -> Any:
    """`fn` with `cfg`'s blocks, jitted once per kernel and config: a program that calls
    the same kernel at the same shapes twice (an MoE layer's gate and up projections,
    forward and backward) traces it once and JAX lowers it once. Lowering a Mosaic GPU
    kernel is Python work of about half a second, one at a time."""
    bm, bn, bk = cfg.blocks
    return jax.jit(
        functools.partial(
            fn, block_m=bm, block_n=bn, block_k=bk,
            max_concurrent_steps=cfg.max_concurrent_steps, grid_block_n=cfg.grid_block_n,
            **extra,
        )
    )  # fmt: skip


def _require(product: str) -> MosaicFunction:
    reason = unsupported(product)
    if reason is not None:
        raise RuntimeError(
            f"RaggedDotConfig(backend='mosaic') cannot run here ({device_kind_name()}): {reason}."
        )
    return _load(*(TRANSPOSED if product == "drhs" else FORWARD))


def edge_groups(sizes: jax.Array, start: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
    """The local groups' sizes with the rows before them (from row 0) added to the
    first group and the rows after them (to row `m`) to the last, so that they cover
    all `m` rows from row 0; and one past the local groups' last row.

    Example:
      >>> import jax.numpy as jnp
      >>> cover, end = edge_groups(jnp.array([2, 0, 3]), jnp.int32(4), 16)
      >>> cover.tolist(), int(end)
      ([6, 0, 10], 9)
    """
    first, end = groups_lib.row_range(sizes, start, m)
    cover = sizes.astype(jnp.int32).at[0].add(first).at[-1].add(m - end)
    return cover, end


def ragged_dot_mosaic(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    cfg: RaggedDotConfig,
    *,
    transpose_rhs: bool,
    group_offset: jax.Array | None = None,
) -> jax.Array:
    """The forward (`rhs` `[G, K, N]`) or, with `transpose_rhs`, d_lhs (`lhs` is
    `d_out[M, N]`, and the product is against each `rhs[g]ᵀ`); with `group_offset`,
    of the `rhs.shape[0]` groups from there on (see the module's note)."""
    found = _require("dlhs" if transpose_rhs else "fwd")
    extra = {"transpose_rhs": True} if transpose_rhs else {}
    if group_offset is None:
        out = _jitted(found.fn, cfg, **extra)(lhs, rhs, group_sizes=group_sizes.astype(jnp.int32))
        return rows_after_groups_zeroed(out, group_sizes)
    m = lhs.shape[0]
    sizes, start = groups_lib.local_groups(group_sizes, group_offset, rhs.shape[0], m)
    cover, end = edge_groups(sizes, start, m)
    out = _jitted(found.fn, cfg, **extra)(lhs, rhs, group_sizes=cover.astype(jnp.int32))
    return groups_lib.rows_outside_zeroed(out, start, end)


def transposed_ragged_dot_mosaic(
    lhs: jax.Array, dout: jax.Array, group_sizes: jax.Array, cfg: RaggedDotConfig
) -> jax.Array:
    """d_rhs `[G, K, N]`: `lhs[rows of g]ᵀ · dout[rows of g]` per group."""
    found = _require("drhs")
    return _jitted(found.fn, cfg)(lhs, dout, group_sizes=group_sizes.astype(jnp.int32))


class MosaicBackend(PallasGradient):
    """JAX's Mosaic GPU grouped matmuls (Hopper, 16-bit inputs)."""

    name = "mosaic"
    lowering = "mosaic_gpu"

    def unusable(self, kernel, inv, cfg) -> str | None:
        offset = kernel.problem(inv).local_g is not None
        return super().unusable(kernel, inv, cfg) or unsupported(kernel.product, offset)

    def run(
        self, kernel, a, b, group_sizes, group_offset=None, *, cfg: RaggedDotConfig,
        out_dtype: str, local_groups: int | None = None,
    ):  # fmt: skip
        if kernel.use_interpreter():
            raise ValueError(
                f"{kernel.op_id}: RaggedDotConfig(backend='mosaic') runs on Hopper GPUs, not "
                "in the Pallas interpreter; use a backend='triton' config."
            )
        if kernel.product == "drhs":
            if group_offset is not None:
                raise ValueError(
                    f"{kernel.op_id}: RaggedDotConfig(backend='mosaic'): {NO_OFFSET_DRHS}."
                )
            out = transposed_ragged_dot_mosaic(a, b, group_sizes, cfg)
        else:
            out = ragged_dot_mosaic(
                a, b, group_sizes, cfg, transpose_rhs=kernel.product == "dlhs",
                group_offset=group_offset,
            )  # fmt: skip
        return out.astype(out_dtype)
