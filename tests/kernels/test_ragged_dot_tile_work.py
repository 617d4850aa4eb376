"""The grouped matmul's model of its tiles' work (`tile_work.padded_work`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kerneltune._src.kernel.base import make_invocation
from kerneltune.kernels.ragged_dot import tile_work
from kerneltune.kernels.ragged_dot.api import RaggedDot, RaggedDotGradLhs, RaggedDotGradRhs
from kerneltune.kernels.ragged_dot.config import XLA, RaggedDotConfig


def tiles(bm, bn, bk, backend="triton"):
    return RaggedDotConfig(backend=backend, block_m=bm, block_n=bn, block_k=bk)


def sizes_of(kernel, *shapes, **kwargs):
    """The key's sizes of a call of `kernel` on arrays of `shapes` (bf16; int32 last)."""
    *arrays, groups = shapes
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in arrays]
    args.append(jax.ShapeDtypeStruct(groups, jnp.int32))
    if "offset" in kwargs:
        args.append(jax.ShapeDtypeStruct((1,), jnp.int32))
        kwargs.pop("offset")
    return make_invocation(kernel, tuple(args), {"out_dtype": "bfloat16", **kwargs}).shape.sizes


def test_columns_that_a_tile_does_not_divide_are_computed_whole():
    sizes = sizes_of(RaggedDot(), (32768, 2048), (64, 2048, 1408), (64,))
    assert tile_work.padded_work("fwd", tiles(128, 256, 64), sizes) == pytest.approx(1536 / 1408)
    assert tile_work.padded_work("fwd", tiles(128, 128, 64), sizes) == pytest.approx(1.0)
    # The contracted axis too, and the same field dict a cache file holds.
    as_dict = {"backend": "mosaic", "block_m": 128, "block_n": 256, "block_k": 96}
    assert tile_work.padded_work("fwd", as_dict, sizes) == pytest.approx(1536 / 1408 * 2112 / 2048)


def test_rows_are_not_counted():
    # 32 rows an expert: 64-row tiles do twice the rows' work, and still won on an H200.
    sizes = sizes_of(RaggedDot(), (8192, 2048), (256, 2048, 512), (256,))
    assert tile_work.padded_work("fwd", tiles(64, 128, 64), sizes) == pytest.approx(1.0)


def test_d_lhs_tiles_the_rhs_k_and_contracts_its_n():
    sizes = sizes_of(RaggedDotGradLhs(), (4096, 1408), (8, 1000, 1408), (8,))
    assert tile_work.dims("dlhs", sizes) == (1000, 1408)
    assert tile_work.padded_work("dlhs", tiles(128, 128, 256), sizes) == pytest.approx(
        1024 / 1000 * 1536 / 1408
    )


def test_d_rhs_tiles_its_k_by_n_output():
    sizes = sizes_of(RaggedDotGradRhs(), (96, 64), (96, 48), (3,))
    assert tile_work.dims("drhs", sizes) == (64, 48)
    assert tile_work.padded_work("drhs", tiles(64, 32, 64), sizes) == pytest.approx(64 / 48)


def test_a_group_offset_call_reads_the_same_axes():
    fwd = sizes_of(RaggedDot(), (4096, 1000), (2, 1000, 1408), (8,), offset=True)
    assert len(fwd) == 7 and tile_work.dims("fwd", fwd) == (1408, 1000)
    drhs = sizes_of(RaggedDotGradRhs(), (96, 64), (96, 48), (3,), offset=True, local_groups=2)
    assert tile_work.dims("drhs", drhs) == (64, 48)


def test_no_model_for_the_plain_jax_backend_odd_blocks_or_foreign_sizes():
    sizes = (8192, 2048, 256, 2048, 1408, 256)
    assert tile_work.padded_work("fwd", XLA, sizes) == 1.0
    assert tile_work.padded_work("fwd", tiles(128, 128, 64), (8192, 2048)) == 1.0
    odd = {"backend": "triton", "block_m": 128, "block_n": True, "block_k": 64}
    assert tile_work.padded_work("fwd", odd, sizes) == 1.0
    numpy_ints = {"backend": "triton", "block_m": 128, "block_n": np.int64(256), "block_k": 64}
    assert tile_work.padded_work("fwd", numpy_ints, sizes) == pytest.approx(1536 / 1408)


def test_each_kernel_models_its_own_product():
    cfg, sizes = tiles(128, 256, 64), (4096, 1408, 8, 1000, 1408, 8)
    assert RaggedDot().padded_work(cfg, sizes) == tile_work.padded_work("fwd", cfg, sizes)
    assert RaggedDotGradLhs().padded_work(cfg, sizes) == tile_work.padded_work("dlhs", cfg, sizes)
    assert RaggedDotGradRhs().padded_work(cfg, (96, 64, 96, 48, 3)) == tile_work.padded_work(
        "drhs", cfg, (96, 64, 96, 48, 3)
    )
