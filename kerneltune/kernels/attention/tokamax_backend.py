"""tokamax's Mosaic GPU flash attention as an optional attention backend.

tokamax (openxla's kernel library) is not a dependency: where it is installed, its
Hopper kernel (`tokamax.dot_product_attention(..., implementation="mosaic")`) joins the
candidates, so a tuned call is never slower than what a tokamax user already has.

Its forward beats cuDNN's in long causal calls (0.91-0.97x cuDNN's time at 8k-32k tokens
with head dim 128 on H100s and H200s, BENCHMARKS.md, 2026-12-06), where the attention
heuristic picks it; its training step loses to cuDNN's at every measured shape (H100,
2026-11-24: 0.87-0.99x). So a differentiated plain call runs cuDNN's forward and
backward where cuDNN takes it; a variant call brings tokamax's own backward, except
where a mask goes in: that backward races (`trusted_gradients`), so cuDNN or XLA
differentiates those calls.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

import jax.numpy as jnp
import numpy as np

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._common import is_hopper, on_gpu
from kerneltune.kernels.attention.chunked import attention_chunked
from kerneltune.kernels.attention.forward_only import forward_only
from kerneltune.kernels.attention.jax_nn import (
    cudnn_attention,
    cudnn_variant,
    cudnn_variant_unsupported,
)
from kerneltune.kernels.attention.masking import Masks, document_ranges, segments_as_mask

#: The dtypes its kernel takes.
DTYPES = (np.dtype("float16"), np.dtype("bfloat16"))


@functools.cache
def installed() -> bool:
    """Whether `tokamax` can be found (found only: importing it is slow, and waits for
    the first call that runs it)."""
    return importlib.util.find_spec("tokamax") is not None


def unsupported(dtype: np.dtype, head_dim: int) -> str | None:
    """Why tokamax's Mosaic attention cannot run a call, or None when it can."""
    if not installed():
        return "tokamax is not installed (pip install tokamax)"
    if not on_gpu() or not is_hopper():
        return "tokamax's Mosaic attention is a Hopper (H100, H200) kernel"
    if np.dtype(dtype) not in DTYPES:
        return f"tokamax's Mosaic attention takes float16 or bfloat16, not {np.dtype(dtype)}"
    if head_dim % 64 or head_dim > 256:
        return f"tokamax's Mosaic attention takes head dims 64, 128, 192 or 256, not {head_dim}"
    return None


def attention(q: Any, k: Any, v: Any, *, causal: bool, sm_scale: float) -> Any:
    """`softmax(q kᵀ · sm_scale) v` by tokamax's Mosaic kernel; k and v may have fewer
    heads than q (grouped-query attention)."""
    tokamax = importlib.import_module("tokamax")
    return tokamax.dot_product_attention(
        q, k, v, scale=sm_scale, is_causal=causal, implementation="mosaic"
    )


class TokamaxBackend(Backend):
    """tokamax's Mosaic GPU attention (Hopper) where installed; it takes grouped-query
    k and v as they are. A call that something differentiates runs cuDNN's forward and
    backward where cuDNN takes it (`forward_only`), else tokamax's own backward.

    The forward alone is what tokamax is chosen for (its forward took 0.91-0.97x
    cuDNN's time at 8k-32k causal tokens on H100s and H200s), but a training call that a
    `jax.checkpoint` or a `jit` inside the gradient hides from kerneltune is keyed as a
    forward, and there tokamax's own training step took 1.11-1.14x cuDNN's (H100,
    BENCHMARKS.md, 2026-12-06)."""

    name = "tokamax"
    differentiated_by_jax = True

    def unusable(self, kernel, inv, cfg) -> str | None:
        q = inv.args[0]
        return unsupported(np.dtype(q.dtype), int(q.shape[-1]))

    def run(self, kernel, q, k, v, *, cfg, causal: bool, sm_scale: float):
        def fast(q, k, v):
            return attention(q, k, v, causal=causal, sm_scale=sm_scale)

        plain = Masks()
        if cudnn_variant_unsupported(q, None, plain, causal=causal, window=None, soft_cap=None):
            return fast(q, k, v)

        def trained(q, k, v):
            return cudnn_attention(q, k, v, causal=causal, sm_scale=sm_scale)

        return forward_only(fast, trained)(q, k, v)


def attention_variant(q, k, v, bias, masks, *, causal, sm_scale, window, soft_cap) -> Any:
    """Any variant by tokamax's Mosaic kernel (it takes every one, soft cap included);
    segment ids go in as a mask, and also as each query's range of keys where tokamax
    takes one (`_packed_documents`). Where a mask goes in, a differentiated call runs
    `trusted_gradients` instead, forward and backward (`forward_only`); where only a
    window or sequence lengths do, cuDNN's forward and backward where cuDNN takes it."""
    static = dict(causal=causal, sm_scale=sm_scale, window=window, soft_cap=soft_cap)
    unmasked = dict(causal=causal, window=window, soft_cap=soft_cap)

    def masked(q, k, v, bias, masks):
        tokamax = importlib.import_module("tokamax")
        return tokamax.dot_product_attention(
            q, k, v, bias, segments_as_mask(masks), scale=sm_scale, is_causal=causal,
            query_seq_lengths=masks.q_lengths, key_value_seq_lengths=masks.kv_lengths,
            local_window_size=window, logits_soft_cap=soft_cap, implementation="mosaic",
        )  # fmt: skip

    if not masks.has_mask:
        if bias is None and not cudnn_variant_unsupported(q, bias, masks, **unmasked):
            # A window or sequence lengths alone: tokamax is chosen for such a forward
            # (`variants.TOKAMAX_WINDOW_FORWARD_MIN_TOKENS`), but its training step took
            # 2.4-7.5x cuDNN's (H100, H200), and a training call hidden from kerneltune by a
            # `jax.checkpoint` is keyed as a forward: cuDNN differentiates it.
            def by_cudnn(q, k, v, bias, masks):
                return cudnn_variant(
                    q, k, v, bias, masks, causal=causal, sm_scale=sm_scale, window=window
                )

            return forward_only(masked, by_cudnn)(q, k, v, bias, masks)
        return masked(q, k, v, bias, masks)  # tokamax's own backward

    def forward(q, k, v, bias, masks):
        packed = _packed_documents() if masks.q_segments is not None else None
        if packed is None:
            return masked(q, k, v, bias, masks)
        return packed(q, k, v, bias, masks, document_ranges(masks), **static)

    def trusted(q, k, v, bias, masks):
        return trusted_gradients(q, k, v, bias, masks, **static)

    # The ranges speed up tokamax's forward (its backward given them was slower than
    # given the mask alone), and with a mask its backward is not trusted at all.
    return forward_only(forward, trusted)(q, k, v, bias, masks)


def trusted_gradients(q, k, v, bias, masks, *, causal, sm_scale, window, soft_cap) -> Any:
    """What runs a differentiated call in tokamax's place where a mask (or segment ids)
    goes in: cuDNN where it takes the call, else XLA a block of queries at a time.

    tokamax 0.0.17's Mosaic backward given a mask is a race: one compiled program, run
    6 times on the same inputs on an H200 (BENCHMARKS.md, 2026-11-27), returned key
    gradients off the float32 reference by up to 0.74 (values near 3) in 2 to 4 of the
    runs, in 4 to 42 of 262,144 elements, with documents packed in order or
    interleaved; cuDNN's were the same bits in all 6 and within bfloat16's rounding.
    """
    if cudnn_variant_unsupported(q, bias, masks, causal=causal, window=window, soft_cap=soft_cap):
        return attention_chunked(
            q, k, v, bias, masks, scale=sm_scale, causal=causal, window=window,
            soft_cap=soft_cap,
        )  # fmt: skip
    return cudnn_variant(q, k, v, bias, masks, causal=causal, sm_scale=sm_scale, window=window)


@functools.cache
def _packed_documents() -> Any:
    """tokamax's Mosaic attention called with a key range per query, or None where
    this tokamax lacks the pieces.

    Its public function takes a boolean mask only, and visits every block the mask
    does not rule out by position: with packed documents, the whole causal triangle.
    Its kernel also takes `[start, end)` keys per query (`base.Mask`'s `k_start`,
    `k_end`) and skips the blocks outside them, so documents packed in order cost
    their own work in the forward pass. Those names are tokamax's internals
    (0.0.17), hence the fallback to the public function when they move.
    """
    try:
        api = importlib.import_module("tokamax._src.ops.attention.api")
        base = importlib.import_module("tokamax._src.ops.attention.base")
        kernel = api.IMPLEMENTATIONS["mosaic_gpu"]
        mask_type, causal_mask_type = base.Mask, base.CausalMask
    except (ImportError, AttributeError, KeyError):
        return None

    def packed(q, k, v, bias, masks, ranges, *, causal, sm_scale, window, soft_cap):
        start, end = ranges
        q_end = None if masks.q_lengths is None else masks.q_lengths[:, None, None]
        if masks.kv_lengths is not None:
            end = jnp.minimum(end, masks.kv_lengths[:, None, None])
        mask = mask_type(
            segments_as_mask(masks), is_causal=causal, q_end=q_end, k_start=start, k_end=end
        )
        if window is not None:
            left, right = window
            mask &= causal_mask_type(offset=right, window_size=left + right + 1)
        return kernel(
            q, k, v, bias=bias, mask=mask, logits_scale=sm_scale, precision=None,
            logits_soft_cap=soft_cap, q_sharding=None,
        )  # fmt: skip

    return packed


class TokamaxVariantBackend(Backend):
    """tokamax's Mosaic GPU attention (Hopper) for every variant, where installed."""

    name = "tokamax"
    differentiated_by_jax = True

    def unusable(self, kernel, inv, cfg) -> str | None:
        q = inv.args[0]
        return unsupported(np.dtype(q.dtype), int(q.shape[-1]))

    def run(self, kernel, q, k, v, bias, masks, *, cfg, causal, sm_scale, window, soft_cap):
        return attention_variant(
            q, k, v, bias, masks, causal=causal, sm_scale=sm_scale, window=window,
            soft_cap=soft_cap,
        )  # fmt: skip
