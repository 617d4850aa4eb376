"""The backend is part of a bundled op's config, so it survives every place a config
is stored: the persistent cache, an `AutotuningResult` file and the tuning of a
manifest's records (issue 10)."""

import pytest

import kerneltune as kt
from kerneltune.kernels import (
    CrossEntropyConfig,
    FwdParams,
    GLUConfig,
    MatmulConfig,
    NormConfig,
    RaggedDotConfig,
)
from tests.helpers import rand

CONFIGS = [
    ("attention@v1", FwdParams(backend="cudnn")),
    ("attention@v1", FwdParams(backend="tokamax")),
    ("attention@v1", FwdParams(q_blocksize=64, kv_blocksize=32, num_warps=4, num_stages=2)),
    ("layer_norm@v1", NormConfig(backend="xla")),
    ("layer_norm@v1", NormConfig(block_size=2048, num_warps=8)),
    ("matmul@v3", MatmulConfig(backend="xla")),
    ("matmul@v3", MatmulConfig(backend="mosaic", block_m=128, block_n=256, block_k=64)),
    ("ragged_dot@v1", RaggedDotConfig(backend="tokamax")),
    ("ragged_dot@v1", RaggedDotConfig(backend="mosaic", grid_block_n=4)),
    ("ragged_dot_drhs@v1", RaggedDotConfig(block_m=64, tile_order="n")),
    ("linear_softmax_cross_entropy@v2", CrossEntropyConfig(backend="xla")),
    (
        "linear_softmax_cross_entropy@v2",
        CrossEntropyConfig(backend="chunked", chunk_size=2048, logits_dtype="input"),
    ),
    (
        "linear_softmax_cross_entropy@v2",
        CrossEntropyConfig(backend="triton", block_m=128, block_v=256, num_stages=3),
    ),
    ("gated_linear_unit@v1", GLUConfig(backend="tokamax")),
    (
        "gated_linear_unit@v1",
        GLUConfig(backend="triton", block_m=128, block_n=128, block_k=64, num_warps=8),
    ),
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
    types = {
        "attention": FwdParams,
        "layer_norm": NormConfig,
        "matmul": MatmulConfig,
        "ragged_dot": RaggedDotConfig,
        "ragged_dot_drhs": RaggedDotConfig,
        "linear_softmax_cross_entropy": CrossEntropyConfig,
        "gated_linear_unit": GLUConfig,
    }
    loaded = kt.AutotuningResult.load(path, types)
    assert [e.cfg for e in loaded] == [cfg for _, cfg in CONFIGS]
    assert [e.cfg.backend for e in loaded] == [
        "cudnn",
        "tokamax",
        "pallas",
        "xla",
        "pallas",
        "xla",
        "mosaic",
        "tokamax",
        "mosaic",
        "triton",
        "xla",
        "chunked",
        "triton",
        "tokamax",
        "triton",
    ]


def test_backends_survive_a_manifest_and_the_tuning_of_its_records(tmp_path):
    # Recorded calls go to a manifest file; tuning the records read back from it (the
    # kernels rebuilt by name) gives configs whose backend field is typed and intact.
    import jax.numpy as jnp

    from kerneltune._src.kernel import recording
    from kerneltune.kernels import LayerNormInterpret

    recording.clear_invocations()
    heuristics = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )
    x = jnp.linspace(-1.0, 1.0, 8 * 256, dtype=jnp.float32).reshape(8, 256)
    with recording.record_calls():
        heuristics(LayerNormInterpret(), x, jnp.ones(256), jnp.zeros(256))
    assert kt.save_manifest(tmp_path / "calls.json") == 1
    recording.clear_invocations()
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), tuner=kt.Tuner(progress=False, iters=1, target_sample_s=1e-4)
    )
    result = kt.autotune_recorded(kt.load_manifest(tmp_path / "calls.json"), selector=chain)
    result.save(tmp_path / "tuned.json")
    (entry,) = kt.AutotuningResult.load(
        tmp_path / "tuned.json", {"layer_norm-interpret": NormConfig}
    )
    assert isinstance(entry.cfg, NormConfig) and entry.cfg.backend == "pallas"
    assert entry.cfg == result.entries[0].cfg


def test_a_ragged_dot_manifest_record_tunes_to_a_typed_config(tmp_path):
    # A traced call is recorded with abstract values only (its group sizes are data);
    # tuning the record read back from the file draws a balanced routing.
    import jax
    import jax.numpy as jnp

    from kerneltune._src.kernel import recording
    from kerneltune.kernels import RaggedDotInterpret

    recording.clear_invocations()
    heuristics = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )
    lhs = jnp.linspace(-1.0, 1.0, 32 * 16, dtype=jnp.float32).reshape(32, 16)
    rhs = jnp.linspace(-1.0, 1.0, 2 * 16 * 16, dtype=jnp.float32).reshape(2, 16, 16)
    with recording.record_calls():
        jax.jit(lambda a, b, s: heuristics(RaggedDotInterpret(), a, b, s))(
            lhs, rhs, jnp.array([12, 20], jnp.int32)
        )
    assert kt.save_manifest(tmp_path / "calls.json") == 1
    recording.clear_invocations()
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), tuner=kt.Tuner(progress=False, iters=1, target_sample_s=1e-4)
    )
    result = kt.autotune_recorded(kt.load_manifest(tmp_path / "calls.json"), selector=chain)
    result.save(tmp_path / "tuned.json")
    (entry,) = kt.AutotuningResult.load(
        tmp_path / "tuned.json", {"ragged_dot-interpret": RaggedDotConfig}
    )
    assert isinstance(entry.cfg, RaggedDotConfig) and entry.cfg.backend == "triton"
    assert entry.cfg == result.entries[0].cfg


@pytest.mark.parametrize(
    "kernel_name", ["LinearSoftmaxCrossEntropyInterpret", "GatedLinearUnitInterpret"]
)
def test_new_ops_backends_survive_a_manifest_and_tuning(tmp_path, kernel_name):
    # The loss head and the gated linear unit: a recorded call written to a manifest,
    # tuned from the file, keeps a typed config whose backend reads back intact.
    import jax
    import jax.numpy as jnp

    from kerneltune import kernels
    from kerneltune._src.kernel import recording

    cls = getattr(kernels, kernel_name)
    kernel = cls()
    cfg_type = kernel.config_type
    x = rand((16, 16), seed=0)
    if cls is kernels.LinearSoftmaxCrossEntropyInterpret:
        args = (x, jnp.arange(16) % 32, jnp.ones((16, 32)) / 4, jnp.ones(16, bool))
        kwargs = {"reduction": "mean"}
    else:
        args = (x, rand((16, 2, 16), seed=1) / 4)
        kwargs = {"activation": jax.nn.silu}
    recording.clear_invocations()
    heuristics = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )
    with recording.record_calls():
        heuristics(kernel, *args, **kwargs)
    assert kt.save_manifest(tmp_path / "calls.json") == 1
    recording.clear_invocations()
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), tuner=kt.Tuner(progress=False, iters=1, target_sample_s=1e-4)
    )
    result = kt.autotune_recorded(kt.load_manifest(tmp_path / "calls.json"), selector=chain)
    result.save(tmp_path / "tuned.json")
    (entry,) = kt.AutotuningResult.load(tmp_path / "tuned.json", {kernel.op_id: cfg_type})
    assert isinstance(entry.cfg, cfg_type) and entry.cfg == result.entries[0].cfg
    assert entry.cfg.backend in {"xla", "chunked", "triton"}
    timed = {c["cfg"]["backend"] for c in result.entries[0].candidates if c["status"] == "ok"}
    assert "triton" in timed and len(timed) >= 2
