"""The Mosaic GPU operations the flash kernels (`mosaic_flash.py`,
`mosaic_flash_backward.py`) are written with: shared-memory tiles laid out for wgmma,
`plgpu.kernel` under the names each JAX version takes, and the register-layout
operations with their plain equivalents for JAX's Mosaic GPU interpreter.

Only the kernels import this module (and with it JAX's Mosaic GPU, a third of a
second): `mosaic_flash_api` imports the kernels when it first builds one, so importing
kerneltune on a machine that never runs them does not pay for it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


def smem_tile(shape: tuple[int, ...], dtype) -> Any:
    """A 16-bit tile in shared memory laid out for wgmma (8x64 tiles, 128-byte swizzle)."""
    return plgpu.SMEM(
        shape, dtype, transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    )


def mosaic_kernel(body, *, out_type, scratch_types, **kwargs):
    """`plgpu.kernel` with its outputs' and scratch's types under the names this JAX
    takes: `out_type` and `scratch_types` from JAX 0.10.2, `out_shape` and
    `scratch_shapes` in 0.10.0."""
    if "out_type" in _kernel_params():
        return plgpu.kernel(body, out_type=out_type, scratch_types=scratch_types, **kwargs)
    return plgpu.kernel(body, out_type, scratch_shapes=scratch_types, **kwargs)


@functools.cache
def _kernel_params() -> frozenset[str]:
    return frozenset(inspect.signature(plgpu.kernel).parameters)


@functools.cache
def _load_takes_index() -> bool:
    """Whether `plgpu.load` requires an index after the ref (JAX 0.10)."""
    idx = inspect.signature(plgpu.load).parameters.get("idx")
    return idx is not None and idx.default is inspect.Parameter.empty


@dataclasses.dataclass(frozen=True)
class Registers:
    """Mosaic GPU's register-layout operations, or their plain equivalents where JAX's
    Mosaic GPU interpreter runs the kernels (the CPU tests): it has no rule for
    `layout_cast`, on which all three rest, and no register layouts to choose."""

    interpreted: bool

    def cast(self, x: jax.Array, layout) -> jax.Array:
        return x if self.interpreted else plgpu.layout_cast(x, layout)

    def iota(self, shape: tuple[int, int], dim: int) -> jax.Array:
        """Positions along `dim` of a wgmma-shaped tile."""
        if self.interpreted:
            return jax.lax.broadcasted_iota(jnp.int32, shape, dim)
        return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)

    def load(self, ref, layout) -> jax.Array:
        if self.interpreted:
            return ref[...]
        if _load_takes_index():  # JAX 0.10; deprecated in 0.11, gone in 0.12
            return plgpu.load(ref, (), layout=layout)
        return plgpu.load(ref, layout=layout)  # type: ignore[call-arg]  # JAX 0.11+

    def rows(self, ref) -> jax.Array:
        """A vector with one entry per row of a wgmma tile (per query)."""
        return self.load(ref, plgpu.Layout.WGMMA.reduce(1))

    def cols(self, ref) -> jax.Array:
        """A vector with one entry per column of a wgmma tile (per key)."""
        return self.load(ref, plgpu.Layout.WGMMA.reduce(0))

    def matmul(self, a, b_ref, *, transpose_b: bool = False, acc=None) -> jax.Array:
        """`a · b` (`a · bᵀ` with `transpose_b`) in float32 on the tensor cores (wgmma),
        added to `acc` in place where given: `a` a shared-memory ref or a 16-bit array
        in registers, `b_ref` a ref. The interpreter's wgmma takes no transposed ref
        and it has no `run_state`, so it multiplies and adds in XLA there."""
        m = a.shape[0]
        n = b_ref.shape[0] if transpose_b else b_ref.shape[1]
        if self.interpreted:
            a_val = a if isinstance(a, jax.Array) else a[...]
            b_val = b_ref[...]
            out = jax.lax.dot_general(
                a_val, b_val, (((1,), (1 if transpose_b else 0,)), ((), ())),
                preferred_element_type=jnp.float32,
            )  # fmt: skip
            return out if acc is None else acc + out
        b = b_ref.transpose((1, 0)) if transpose_b else b_ref

        if acc is not None:

            def accumulate(acc_ref):
                plgpu.wgmma(acc_ref, a, b)

            return pl.run_state(accumulate)(plgpu.ACC.init(acc))

        def product(acc_ref):
            plgpu.wgmma(acc_ref, a, b)
            return acc_ref[...]

        return pl.run_scoped(product, plgpu.ACC((m, n), jnp.float32))
