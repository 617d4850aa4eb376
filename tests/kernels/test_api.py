"""`kerneltune.kernels`' public names, and what every bundled kernel shares."""

from __future__ import annotations

import dataclasses

import pytest

import kerneltune as kt
from kerneltune import kernels

KERNELS = [
    kernels.Matmul,
    kernels.Attention,
    kernels.AttentionBackward,
    kernels.AttentionVariants,
    kernels.LayerNorm,
    kernels.RMSNorm,
    kernels.Softmax,
    kernels.RaggedDot,
    kernels.RaggedDotGradLhs,
    kernels.RaggedDotGradRhs,
    kernels.LinearSoftmaxCrossEntropy,
    kernels.GatedLinearUnit,
]
INTERPRETED = [
    kernels.MatmulInterpret,
    kernels.AttentionInterpret,
    kernels.AttentionBackwardInterpret,
    kernels.LayerNormInterpret,
    kernels.RMSNormInterpret,
    kernels.SoftmaxInterpret,
    kernels.RaggedDotInterpret,
    kernels.RaggedDotGradLhsInterpret,
    kernels.RaggedDotGradRhsInterpret,
    kernels.LinearSoftmaxCrossEntropyInterpret,
    kernels.GatedLinearUnitInterpret,
]


def test_every_name_in_all_imports():
    for name in kernels.__all__:
        assert getattr(kernels, name) is not None, name
    assert sorted(kernels.__all__) == kernels.__all__


@pytest.mark.parametrize("cls", KERNELS + INTERPRETED, ids=lambda c: c.__name__)
def test_kernels_are_versioned_typed_and_have_distinct_op_ids(cls):
    kernel = cls()
    assert isinstance(kernel, kt.Kernel)
    # Matmul is at v3: its configs gained the Mosaic GPU backend (v2), then XLA (v3);
    # its interpreted form follows it since the interpreter became an option (it was a
    # class of its own at v1). The loss head is at v3 (`logits_dtype`, `lse_backend`).
    moved = {kernels.Matmul: "3", kernels.LinearSoftmaxCrossEntropy: "3"}
    version = next((v for base, v in moved.items() if isinstance(kernel, base)), "1")
    assert kernel.version == version
    assert dataclasses.is_dataclass(kernel.config_type)
    params = kernel.config_type.__dataclass_params__
    assert params.frozen


def test_interpreted_variants_never_share_cache_keys_with_gpu_kernels():
    ids = [c().op_id for c in KERNELS + INTERPRETED]
    assert len(set(ids)) == len(ids)
    assert all(c().interpret for c in INTERPRETED) and not any(c().interpret for c in KERNELS)
