"""The grouped matmul's model of its tiles' work (`tile_work.padded_work`)."""

from __future__ import annotations

import pytest

from kerneltune.kernels.ragged_dot import tile_work
from kerneltune.kernels.ragged_dot.api import RaggedDot, RaggedDotGradLhs, RaggedDotGradRhs
from kerneltune.kernels.ragged_dot.config import XLA, RaggedDotConfig


def tiles(bm, bn, bk, backend="triton"):
    return RaggedDotConfig(backend=backend, block_m=bm, block_n=bn, block_k=bk)


def test_columns_that_a_tile_does_not_divide_are_computed_whole():
    # Forward: lhs[32768, 2048], rhs[64, 2048, 1408], 64 groups of 512 rows.
    sizes = (32768, 2048, 64, 2048, 1408, 64)
    assert tile_work.padded_work("fwd", tiles(128, 256, 64), sizes) == pytest.approx(1536 / 1408)
    assert tile_work.padded_work("fwd", tiles(128, 128, 64), sizes) == pytest.approx(1.0)
    # The same field dict a cache file holds.
    as_dict = {"backend": "mosaic", "block_m": 128, "block_n": 256, "block_k": 64}
    assert tile_work.padded_work("fwd", as_dict, sizes) == pytest.approx(1536 / 1408)


def test_row_tiles_count_per_group_for_the_balanced_routing():
    # 8192 rows over 256 groups: 32 rows a group, each in a tile of its own.
    sizes = (8192, 2048, 256, 2048, 512, 256)
    assert tile_work.padded_work("fwd", tiles(128, 128, 64), sizes) == pytest.approx(4.0)
    assert tile_work.padded_work("fwd", tiles(32, 128, 64), sizes) == pytest.approx(1.0)
    # 100 rows over 3 groups (34, 33, 33) in tiles of 32: rows 0-33 touch 2 tiles, 34-66
    # 2 (tiles 1 and 2), 67-99 2 (tiles 2 and 3): 6 tiles of 32 rows for 100.
    assert tile_work.padded_work("fwd", tiles(32, 16, 16), (100, 16, 3, 16, 16, 3)) == (
        pytest.approx(6 * 32 / 100)
    )


def test_d_lhs_tiles_the_rhs_k_and_contracts_its_n():
    # d_out[4096, 1408], rhs[8, 1000, 1408] -> d_lhs[4096, 1000], 1408 contracted.
    sizes = (4096, 1408, 8, 1000, 1408, 8)
    assert tile_work.padded_work("dlhs", tiles(128, 128, 256), sizes) == pytest.approx(
        1024 / 1000 * 1536 / 1408
    )


def test_d_rhs_walks_each_groups_rows_in_steps():
    # lhs[96, 64], d_out[96, 48], 3 groups of 32 rows -> [3, 64, 48]; steps of 64 rows.
    sizes = (96, 64, 96, 48, 3)
    assert tile_work.padded_work("drhs", tiles(64, 32, 64), sizes) == pytest.approx(
        64 * 64 * (3 * 64) / (64 * 48 * 96)
    )


def test_no_model_for_the_plain_jax_backend_or_foreign_sizes():
    assert tile_work.padded_work("fwd", XLA, (8192, 2048, 256, 2048, 512, 256)) == 1.0
    assert tile_work.padded_work("fwd", tiles(128, 128, 64), (8192, 2048)) == 1.0


def test_each_kernel_models_its_own_product():
    cfg, sizes = tiles(128, 256, 64), (4096, 1408, 8, 1000, 1408, 8)
    assert RaggedDot().padded_work(cfg, sizes) == tile_work.padded_work("fwd", cfg, sizes)
    assert RaggedDotGradLhs().padded_work(cfg, sizes) == tile_work.padded_work("dlhs", cfg, sizes)
    assert RaggedDotGradRhs().padded_work(cfg, (96, 64, 96, 48, 3)) == tile_work.padded_work(
        "drhs", cfg, (96, 64, 96, 48, 3)
    )
