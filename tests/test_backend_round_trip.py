"""The backend is part of a bundled op's config, so it survives every place a config
is stored: the persistent cache and an `AutotuningResult` file (issue 10)."""

import pytest

import kerneltune as kt
from kerneltune.kernels import FwdParams, MatmulConfig, NormConfig

CONFIGS = [
    ("attention@v1", FwdParams(backend="cudnn")),
    ("attention@v1", FwdParams(q_blocksize=64, kv_blocksize=32, num_warps=4, num_stages=2)),
    ("layer_norm@v1", NormConfig(backend="xla")),
    ("layer_norm@v1", NormConfig(block_size=2048, num_warps=8)),
    ("matmul@v3", MatmulConfig(backend="xla")),
    ("matmul@v3", MatmulConfig(backend="mosaic", bm=128, bn=256, bk=64)),
]


@pytest.mark.parametrize("op, cfg", CONFIGS, ids=lambda v: str(v))
def test_backend_survives_the_persistent_cache(tmp_path, op, cfg):
    kt.PersistentCache(str(tmp_path)).put("gpu|x", op, "key", cfg)
    fresh = kt.PersistentCache(str(tmp_path))  # a new process would build a new one
    assert fresh.get("gpu|x", op, "key", cfg_type=type(cfg)) == cfg


def test_backends_survive_a_result_file(tmp_path):
    entries = tuple(kt.Entry(op, f"key{i}", cfg) for i, (op, cfg) in enumerate(CONFIGS))
    path = tmp_path / "result.json"
    kt.AutotuningResult("gpu|x", entries).save(path)
    types = {"attention": FwdParams, "layer_norm": NormConfig, "matmul": MatmulConfig}
    loaded = kt.AutotuningResult.load(path, types)
    assert [e.cfg for e in loaded] == [cfg for _, cfg in CONFIGS]
    assert [e.cfg.backend for e in loaded] == ["cudnn", "pallas", "xla", "pallas", "xla", "mosaic"]
