"""The matmul's Mosaic GPU backend on a CPU: its config, its pruned candidate space,
the mapping onto JAX's module across that module's versions, and where it is offered.
No GPU: the kernel itself only runs on Hopper (the GPU benchmark checks it there)."""

from __future__ import annotations

import dataclasses
import enum
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune._src.kernel.base import make_invocation
from kerneltune.kernels import Matmul, MatmulConfig
from kerneltune.kernels.matmul import api
from kerneltune.kernels.matmul import config as mc
from kerneltune.kernels.matmul import mosaic_space as ms
from kerneltune.kernels.matmul import pallas_mosaic as pm

# Tests of what happens off a Hopper GPU, on the CPU this suite runs on in CI.
cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="behaviour off a GPU")

BF16 = np.dtype(jnp.bfloat16)
HOPPER_SMEM = 227 * 1024


def mosaic(**fields):
    return MatmulConfig(backend="mosaic", **fields)


def problem(m, k, n, dtype=BF16):
    return mc.MatmulProblem(m, n, k, np.dtype(dtype))


# --- the config ---------------------------------------------------------------------


def test_each_backend_fills_in_its_own_defaults_and_leaves_the_others_none():
    t = MatmulConfig()
    assert (t.num_warps, t.num_stages, t.group_m) == (4, 3, 8)
    assert t.max_concurrent_steps is None and t.wg_dimension is None
    m = mosaic()
    assert (m.max_concurrent_steps, m.wg_dimension, m.cluster_dimension) == (4, "n", None)
    assert (m.grid_minor_dim, m.grid_tile_width, m.epi_tile_m, m.epi_tile_n) == ("n", 1, 64, 64)
    assert m.num_warps is None and m.num_stages is None and m.group_m is None
    # Defaults written out or left to fill in build the same config.
    assert mosaic(max_concurrent_steps=4, grid_tile_width=1) == m
    assert hash(mosaic(max_concurrent_steps=4)) == hash(m)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"backend": "cuda"},
            r"MatmulConfig.backend must be one of \('triton', 'mosaic', 'xla'\), got 'cuda'",
        ),
        (
            {"max_concurrent_steps": 4},
            "MatmulConfig.max_concurrent_steps is a field of backend='mosaic'; leave it None "
            r"with backend='triton' \(got 4\)",
        ),
        (
            {"cluster_dimension": "m"},
            "MatmulConfig.cluster_dimension is a field of backend='mosaic'",
        ),
        (
            {"backend": "mosaic", "num_warps": 8},
            "MatmulConfig.num_warps is a field of backend='triton'; leave it None with "
            r"backend='mosaic' \(got 8\)",
        ),
        ({"backend": "mosaic", "wg_dimension": "k"}, "MatmulConfig.wg_dimension must be one of"),
        (
            {"backend": "mosaic", "grid_minor_dim": "x"},
            "MatmulConfig.grid_minor_dim must be one of",
        ),
        (
            {"backend": "mosaic", "cluster_dimension": "k"},
            "MatmulConfig.cluster_dimension must be None or one of",
        ),
        (
            {"backend": "mosaic", "max_concurrent_steps": 0},
            "max_concurrent_steps must be a positive",
        ),
        ({"backend": "mosaic", "grid_tile_width": -1}, "grid_tile_width must be a positive"),
        (
            {"backend": "mosaic", "block_n": 96},
            "MatmulConfig.block_n must be a positive power of two",
        ),
        (
            {"backend": "mosaic", "block_m": 64, "wg_dimension": "m"},
            r"each compute warpgroup gets a 32×128 tile .* multiple of 64",
        ),
        (
            {"backend": "mosaic", "block_m": 64, "block_n": 64, "epi_tile_n": 64},
            r"epi_tile_n=64 is larger than the warpgroup tile's width \(32",
        ),
        ({"backend": "mosaic", "epi_tile_m": 48}, "epi_tile_m must be a positive power of two"),
    ],
)
def test_config_is_validated_where_it_is_built(fields, message):
    with pytest.raises(ValueError, match=message):
        MatmulConfig(**fields)


@pytest.mark.parametrize(
    "cfg",
    [
        MatmulConfig(block_m=64, block_n=128, block_k=32, num_warps=8, num_stages=4),
        mosaic(block_m=128, block_n=256, cluster_dimension="m", grid_tile_width=8),
        mosaic(
            block_m=256,
            block_n=128,
            wg_dimension="m",
            cluster_dimension="n",
            max_concurrent_steps=3,
        ),
    ],
    ids=["triton", "mosaic", "mosaic-m"],
)
def test_configs_round_trip_json_and_hash(cfg):
    text = kt.to_json(cfg)
    back = kt.from_json(text, MatmulConfig)
    assert back == cfg and hash(back) == hash(cfg) and kt.to_json(back) == text
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.block_m = 64  # type: ignore[misc]


def test_json_written_before_the_backend_field_reads_as_a_triton_config():
    old = '{"block_k":32,"block_m":64,"block_n":128,"group_m":8,"num_stages":4,"num_warps":8}'
    assert kt.from_json(old, MatmulConfig) == MatmulConfig(
        block_m=64, block_n=128, block_k=32, num_warps=8, num_stages=4
    )


def test_repr_shows_the_chosen_backends_fields_only():
    assert repr(MatmulConfig()) == (
        "MatmulConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3, group_m=8)"
    )
    text = repr(mosaic(block_m=128, block_n=256, cluster_dimension="m"))
    assert text.startswith("MatmulConfig(backend='mosaic', block_m=128, block_n=256, block_k=64,")
    assert "cluster_dimension='m'" in text and "num_warps" not in text


def test_tiles_of_warpgroups_and_clusters():
    c = mosaic(block_m=128, block_n=256, wg_dimension="n", cluster_dimension="m")
    assert c.warpgroup_tile == (128, 128) and c.cluster_tile == (256, 256) and c.cluster_size == 2
    c = mosaic(block_m=256, block_n=128, wg_dimension="m")
    assert c.warpgroup_tile == (128, 128) and c.cluster_tile == (256, 128) and c.cluster_size == 1
    assert MatmulConfig(block_m=64, block_n=32).cluster_tile == (64, 32)


def test_triton_helpers_reject_mosaic_configs():
    with pytest.raises(ValueError, match="expected a backend='triton' MatmulConfig"):
        mc.shared_memory_bytes(problem(64, 64, 64), mosaic())


# --- the candidate space --------------------------------------------------------------


def test_large_aligned_problem_keeps_the_whole_curated_space():
    p = problem(4096, 4096, 4096)
    kept, pruned = ms.candidates(p, smem_limit=HOPPER_SMEM)
    assert len(kept) == 16 and not pruned
    assert len(set(kept)) == 16
    for c in kept:
        assert c.backend == "mosaic" and c.block_k == ms.BK
        assert ms.shared_memory_bytes(p, c) <= HOPPER_SMEM
        cm, cn = c.cluster_tile
        assert p.m % cm == 0 and p.n % cn == 0 and p.k % c.block_k == 0
        assert ms.accumulator_registers(c) <= ms.MAX_ACCUMULATOR_REGISTERS
    # Each tile and cluster comes at the deepest pipeline that fits, and one shallower.
    for block_m, block_n, _ in ms.TILES:
        depths = sorted(
            c.max_concurrent_steps for c in kept if (c.block_m, c.block_n) == (block_m, block_n)
        )
        assert len(depths) == 4 and depths[0] == depths[-1] - 1
        deeper = dataclasses.replace(
            next(c for c in kept if (c.block_m, c.block_n) == (block_m, block_n)),
            max_concurrent_steps=depths[-1] + 1,
        )
        assert ms.shared_memory_bytes(p, deeper) > HOPPER_SMEM or depths[-1] == ms.MAX_STEPS


def test_the_shared_memory_estimate_matches_the_kernels_buffers():
    # 4 steps of (128×64 + 64×256) bf16, two warpgroups × two 64×64 output slots, slack.
    c = mosaic(block_m=128, block_n=256, max_concurrent_steps=4)
    expected = 4 * (128 * 64 + 64 * 256) * 2 + 2 * 2 * 64 * 64 * 2 + ms.SMEM_SLACK_BYTES
    assert ms.shared_memory_bytes(problem(4096, 4096, 4096), c) == expected


def test_less_shared_memory_gives_shallower_pipelines():
    p = problem(4096, 4096, 4096)
    big, _ = ms.candidates(p, smem_limit=HOPPER_SMEM)
    small, _ = ms.candidates(p, smem_limit=160 * 1024)
    assert max(c.max_concurrent_steps for c in small) < max(c.max_concurrent_steps for c in big)
    assert all(ms.shared_memory_bytes(p, c) <= 160 * 1024 for c in small)


def test_a_short_k_caps_the_pipeline_depth():
    p = problem(4096, 128, 4096)  # two K steps of 64
    kept, _ = ms.candidates(p, smem_limit=HOPPER_SMEM)
    assert kept and {c.max_concurrent_steps for c in kept} <= {1, 2}
    deep = mosaic(block_m=128, block_n=256, max_concurrent_steps=4)
    _, pruned = ms.candidates(p, smem_limit=HOPPER_SMEM, configs=[deep])
    assert "max_concurrent_steps=4 is more than the 2 K steps" in pruned[0].reason


def test_skinny_problem_keeps_the_short_tile_and_says_why_the_others_are_out():
    kept, pruned = ms.candidates(problem(64, 8192, 8192), smem_limit=HOPPER_SMEM)
    assert {(c.block_m, c.block_n, c.cluster_dimension) for c in kept} == {(64, 256, None)}
    reasons = [x.reason for x in pruned]
    assert "M=64 is not a multiple of 128 (block_m=128; would need padding)" in reasons
    assert any("block_m=64 × 2 blocks of a cluster along m" in r for r in reasons)


def test_too_much_shared_memory_or_too_many_registers_are_pruned_with_reasons():
    p = problem(4096, 4096, 4096)
    deep = mosaic(block_m=128, block_n=256, max_concurrent_steps=6)
    wide = mosaic(
        block_m=256, block_n=256, wg_dimension="m", max_concurrent_steps=2
    )  # 128×256 each
    kept, pruned = ms.candidates(p, smem_limit=HOPPER_SMEM, configs=[deep, wide])
    assert not kept
    assert re.search(r"needs \d+ KiB of shared memory .* more than the 227 KiB", pruned[0].reason)
    assert "128×256 float32 accumulator needs 256 registers per thread" in pruned[1].reason


def test_only_16_bit_inputs_get_mosaic_configs():
    assert ms.offered(problem(256, 256, 256), hopper=True)
    assert ms.offered(problem(256, 256, 256, np.float16), hopper=True)
    assert not ms.offered(problem(256, 256, 256, np.float32), hopper=True)
    assert not ms.offered(problem(256, 256, 256), hopper=False)
    _, pruned = ms.candidates(problem(256, 256, 256, np.float32), smem_limit=HOPPER_SMEM)
    assert all("16-bit inputs, not float32" in x.reason for x in pruned)


def test_a_jax_without_the_module_prunes_every_mosaic_config_with_the_reason():
    support = ms.MosaicSupport(reason="`import x` failed (ImportError: no absl)")
    kept, pruned = ms.candidates(problem(4096, 4096, 4096), HOPPER_SMEM, support)
    assert not kept and len(pruned) == 16
    assert all(
        x.reason == "JAX's Mosaic GPU Hopper matmul cannot run here: `import x` failed "
        "(ImportError: no absl)"
        for x in pruned
    )
    old = ms.MosaicSupport(fields=ms.TUNING_FIELDS - {"wg_dimension", "cluster_dimension"})
    kept, pruned = ms.candidates(problem(4096, 4096, 4096), HOPPER_SMEM, old)
    assert not kept and "has no ['cluster_dimension', 'wg_dimension']" in pruned[0].reason


def test_both_backends_together_heuristic_first_then_mosaic():
    p = problem(4096, 4096, 4096)
    both, pruned = ms.candidates_with_mosaic(p, HOPPER_SMEM)
    triton, triton_pruned = mc.candidates(p, HOPPER_SMEM)
    mosaic_kept, _ = ms.candidates(p, HOPPER_SMEM)
    assert both[0] == mc.heuristic(p)
    assert both[1 : 1 + len(mosaic_kept)] == mosaic_kept
    assert set(both) == set(triton) | set(mosaic_kept) and len(both) == len(set(both))
    assert pruned == triton_pruned  # nothing of the curated space is pruned here
    # The bundled benchmark's large shapes stay within the tuner's exhaustive search.
    assert len(both) <= 128


# --- JAX's module, whichever version --------------------------------------------------


class Dim(enum.IntEnum):
    M = 0
    N = 1


def fake_module(matmul, fields=None):
    names = fields if fields is not None else sorted(ms.TUNING_FIELDS)
    tuning = dataclasses.make_dataclass(
        "TuningConfig",
        [(n, object, dataclasses.field(default=None)) for n in names],
        frozen=True,
    )

    class Module:
        TuningConfig = tuning
        MatmulDimension = Dim

    Module.matmul = staticmethod(matmul)  # type: ignore[attr-defined]
    return Module


def test_the_module_is_read_whichever_matmul_signature_it_has():
    def with_c(a, b, c, config):
        return a

    def without_c(a, b, config):
        return a

    def no_config(a, b):
        return a

    def more(a, b, config, scale):
        return a

    assert pm.inspect_module(fake_module(with_c)).passes_c
    new = pm.inspect_module(fake_module(without_c))
    assert new.support.reason is None and not new.passes_c
    assert "takes no `config`" in pm.inspect_module(fake_module(no_config)).support.reason
    assert "also requires ['scale']" in pm.inspect_module(fake_module(more)).support.reason
    assert "has no TuningConfig" in pm.inspect_module(object()).support.reason
    old = pm.inspect_module(fake_module(without_c, fields=["tile_m", "tile_n", "tile_k"]))
    assert old.support.reason is None and "wg_dimension" not in old.support.fields


def test_a_required_tuning_field_kerneltune_does_not_set_is_a_reason():
    module = fake_module(lambda a, b, config: a)
    module.TuningConfig = dataclasses.make_dataclass("TuningConfig", [("num_ctas", int)])
    assert "requires ['num_ctas']" in pm.inspect_module(module).support.reason


def test_configs_map_onto_the_modules_per_warpgroup_tiles():
    module = fake_module(lambda a, b, config: a)
    tc = pm.tuning_config(
        mosaic(
            block_m=256, block_n=128, wg_dimension="m", cluster_dimension="n", grid_tile_width=8
        ),
        module,
    )
    assert (tc.tile_m, tc.tile_n, tc.tile_k, tc.max_concurrent_steps) == (128, 128, 64, 4)
    assert (tc.wg_dimension, tc.cluster_dimension, tc.grid_minor_dim) == (Dim.M, Dim.N, Dim.N)
    assert (tc.grid_tile_width, tc.epi_tile_m, tc.epi_tile_n) == (8, 64, 64)
    assert pm.tuning_config(mosaic(), module).cluster_dimension is None


def test_the_mosaic_kernel_lowers_for_a_hopper_gpu_with_this_jax(monkeypatch):
    """Lowers (no GPU needed) a few curated configs through the installed JAX's module;
    checks the shared-memory estimate against the size the kernel asks for. Skipped
    where the module does not import (it needs absl, which CI does not install)."""
    pytest.importorskip("absl")
    loaded = pm.inspect_module(pytest.importorskip(pm.MODULE))
    if loaded.support.reason is not None:
        pytest.skip(loaded.support.reason)
    if not hasattr(loaded.module, "get_num_sms"):
        # JAX 0.10.0's kernel asks the default device for its SM count: only a GPU can
        # lower it (later versions read it through this function, patched here).
        pytest.skip("this JAX's Mosaic matmul reads the SM count from a GPU to lower")
    monkeypatch.setattr(loaded.module, "get_num_sms", lambda: 132)
    p = problem(1024, 512, 1024)
    x = jax.ShapeDtypeStruct((p.m, p.k), jnp.bfloat16)
    y = jax.ShapeDtypeStruct((p.k, p.n), jnp.bfloat16)

    def lower(cfg):
        tc = pm.tuning_config(cfg, loaded.module)
        fn = jax.jit(
            lambda a, b: loaded.fn(a, b, **({"c": None} if loaded.passes_c else {}), config=tc)
        )
        return fn.trace(x, y).lower(lowering_platforms=("cuda",)).as_text()

    kept, _ = ms.candidates(p, smem_limit=HOPPER_SMEM)
    for cfg in kept[::5]:
        assert "mosaic_gpu" in lower(cfg)
    too_deep = dataclasses.replace(kept[0], max_concurrent_steps=kept[0].max_concurrent_steps + 2)
    with pytest.raises(ValueError, match=r"smem_bytes=(\d+)") as err:
        lower(too_deep)
    actual = int(re.search(r"smem_bytes=(\d+)", str(err.value)).group(1))
    assert 0 <= ms.shared_memory_bytes(p, too_deep) - actual <= ms.SMEM_SLACK_BYTES


# --- where Mosaic configs are offered ----------------------------------------------------


@cpu_only
def test_off_hopper_the_space_is_unchanged():
    kernel = Matmul(interpret=True)
    p = problem(256, 256, 256)
    x = jnp.ones((256, 256), jnp.bfloat16)
    inv = make_invocation(kernel, (x, x), {})
    assert kernel.search_space(inv) == ([api.XLA, *mc.candidates(p)[0]], mc.candidates(p)[1])
    assert kernel.pruned_cfgs(inv) == mc.candidates(p)[1]
    assert kernel.candidate_cfgs(inv) == mc.interpret_candidates(p)


def test_on_a_hopper_gpu_16_bit_problems_get_every_backend(monkeypatch):
    monkeypatch.setattr(api, "is_hopper", lambda: True)
    monkeypatch.setattr(Matmul, "use_interpreter", lambda self: False)
    monkeypatch.setattr(pm, "support", lambda: ms.MosaicSupport())
    kernel = Matmul()

    def space(p):
        x = jnp.ones((p.m, p.k), p.dtype)
        return kernel.search_space(make_invocation(kernel, (x, jnp.ones((p.k, p.n), p.dtype)), {}))

    p = problem(4096, 4096, 4096)
    kept, pruned = space(p)
    # cuBLAS (the XLA backend) first: the heuristic on GPUs, and a contender.
    assert kept == [api.XLA, *ms.candidates_with_mosaic(p)[0]]
    assert {c.backend for c in kept} == {"xla", "triton", "mosaic"}
    f32 = problem(4096, 4096, 4096, np.float32)
    assert space(f32) == ([api.XLA, *mc.candidates(f32)[0]], mc.candidates(f32)[1])
    monkeypatch.setattr(pm, "support", lambda: ms.MosaicSupport(reason="no module"))
    kept, pruned = space(p)
    assert {c.backend for c in kept} == {"xla", "triton"}
    assert sum("no module" in x.reason for x in pruned) == 16


def test_a_mosaic_config_is_refused_by_the_interpreter_with_a_clear_error():
    x = jnp.ones((128, 64), jnp.bfloat16)
    y = jnp.ones((64, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="runs on Hopper GPUs, not in the Pallas interpreter"):
        Matmul(interpret=True).run(x, y, cfg=mosaic(block_m=128, block_n=256))


@cpu_only
def test_the_mosaic_kernel_off_hopper_raises_a_runtime_error():
    x = jnp.ones((128, 64), jnp.bfloat16)
    y = jnp.ones((64, 256), jnp.bfloat16)
    with pytest.raises(RuntimeError, match="MatmulConfig\\(backend='mosaic'\\)"):
        pm.matmul_mosaic(x, y, mosaic(block_m=128, block_n=256))


@cpu_only
def test_a_mosaic_config_on_the_cpu_xla_path_computes_the_product():
    # On CPUs every config runs `jnp.dot`: a config tuned on a GPU does no harm here.
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (128, 64), jnp.float32)
    y = jax.random.normal(jax.random.fold_in(key, 1), (64, 256), jnp.float32)
    ex = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )
    out = ex(Matmul(executor=ex), x, y, cfg=mosaic(block_m=128, block_n=256))
    np.testing.assert_allclose(out, np.asarray(x) @ np.asarray(y), rtol=1e-5, atol=1e-4)
