"""The backends `jax.nn.dot_product_attention` offers: cuDNN's fused attention and
XLA's. Both take grouped-query k and v as they are and bring their own backward, which
JAX differentiates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._common import on_gpu
from kerneltune.kernels.attention.masking import segments_as_mask


class CudnnBackend(Backend):
    """`jax.nn.dot_product_attention(implementation="cudnn")` (NVIDIA GPUs)."""

    name = "cudnn"
    differentiated_by_jax = True

    def unusable(self, kernel, inv, cfg) -> str | None:
        return None if on_gpu() else "cuDNN's attention runs on NVIDIA GPUs"

    def run(self, kernel, q, k, v, *, cfg, causal: bool, sm_scale: float):
        return cudnn_attention(q, k, v, causal=causal, sm_scale=sm_scale)


def cudnn_attention(q, k, v, *, causal: bool, sm_scale: float) -> jax.Array:
    """Plain attention by cuDNN's fused kernel, through `jax.nn`."""
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


def cudnn_variant_unsupported(q, bias, masks, *, causal: bool, window, soft_cap) -> str | None:
    """Why cuDNN (through `jax.nn`, JAX 0.10 to 0.12 alike) cannot run a variant call,
    or None when it can. It takes a bias, a mask, sequence lengths and a window open to
    the left; it has no soft cap, and a bias or mask must span every query and key."""
    if soft_cap is not None:
        return "cuDNN's attention has no logits soft cap"
    if np.dtype(q.dtype) not in (np.dtype("float16"), np.dtype(jnp.bfloat16)):
        return f"cuDNN's attention takes float16 or bfloat16, not {q.dtype}"
    if q.shape[-1] % 8 or q.shape[-1] > 128:
        return f"cuDNN's attention takes head dims that are multiples of 8 up to 128, not {q.shape[-1]}"
    if window is not None and window[1] != 0 and not causal:
        return f"cuDNN's window reaches left only (or under is_causal), not {window}"
    for name, x in (("bias", bias), ("mask", masks.mask)):
        if x is not None and (x.shape[2] == 1 or x.shape[3] == 1):
            return f"cuDNN takes a {name} over every query and key, not one shaped {x.shape}"
    return None


class CudnnVariantBackend(Backend):
    """cuDNN's fused attention through `jax.nn.dot_product_attention` for the variants
    it takes; segment ids go in as a mask (cuDNN reads all of it: no blocks skipped)."""

    name = "cudnn"
    differentiated_by_jax = True

    def unusable(self, kernel, inv, cfg) -> str | None:
        if not on_gpu():
            return "cuDNN's attention runs on NVIDIA GPUs"
        q, _, _, bias, masks = inv.args
        kw = inv.kwargs
        return cudnn_variant_unsupported(
            q, bias, masks, causal=kw["causal"], window=kw["window"], soft_cap=kw["soft_cap"]
        )

    def run(self, kernel, q, k, v, bias, masks, *, cfg, causal, sm_scale, window, soft_cap):
        return cudnn_variant(q, k, v, bias, masks, causal=causal, sm_scale=sm_scale, window=window)


def cudnn_variant(q, k, v, bias, masks, *, causal: bool, sm_scale: float, window) -> jax.Array:
    """A variant call (no soft cap: `cudnn_variant_unsupported`) by cuDNN's fused
    attention; segment ids go in as a mask."""
    return jax.nn.dot_product_attention(
        q, k, v, bias, segments_as_mask(masks), scale=sm_scale, is_causal=causal,
        query_seq_lengths=masks.q_lengths, key_value_seq_lengths=masks.kv_lengths,
        local_window_size=window, implementation="cudnn",
    )  # fmt: skip
