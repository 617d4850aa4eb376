"""The backends `jax.nn.dot_product_attention` offers: cuDNN's fused attention and
XLA's. Both take grouped-query k and v as they are and bring their own backward, which
JAX differentiates."""

from __future__ import annotations

import jax

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._common import on_gpu


class CudnnBackend(Backend):
    """`jax.nn.dot_product_attention(implementation="cudnn")` (NVIDIA GPUs)."""

    name = "cudnn"
    differentiated_by_jax = True

    def unusable(self, kernel, inv, cfg) -> str | None:
        return None if on_gpu() else "cuDNN's attention runs on NVIDIA GPUs"

    def run(self, kernel, q, k, v, *, cfg, causal: bool, sm_scale: float):
        return jax.nn.dot_product_attention(
            q, k, v, scale=sm_scale, is_causal=causal, implementation="cudnn"
        )


class XlaBackend(Backend):
    """`jax.nn.dot_product_attention(implementation="xla")`: plain JAX's program."""

    name = "xla"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, q, k, v, *, cfg, causal: bool, sm_scale: float):
        # JAX's XLA attention promotes 16-bit inputs against float32 inside: under a
        # caller's strict dtype promotion it would fail where cuDNN's runs.
        with jax.numpy_dtype_promotion("standard"):
            return jax.nn.dot_product_attention(
                q, k, v, scale=sm_scale, is_causal=causal, implementation="xla"
            )
