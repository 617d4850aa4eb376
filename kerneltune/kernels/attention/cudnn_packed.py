"""cuDNN's fused attention on packed documents: each document is a segment of cuDNN's
packed layout (its offset and length), so cuDNN attends within each document and skips
the blocks between documents, forward and backward. Given the equivalent dense mask,
cuDNN and tokamax read every block.

cuDNN's packed layout is reached through JAX's own cuDNN wrapper
(`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`, the function
`jax.nn.dot_product_attention(implementation="cudnn")` calls, with its `q_offsets` and
`kv_offsets`; the same on JAX 0.10.0, 0.10.2 and 0.12.0.1). It needs a Hopper GPU.

A call's documents are data, but the layout's number of segment slots is a shape:
`DOCUMENT_SLOTS`. A call whose segment ids are not packed documents this layout can
express (the query's and the keys' ids differ, a document's tokens are not contiguous
and in order, or more documents than slots) runs what the kernel's `library_cfg` picks
instead, chosen at run time (`lax.cond`): the result is always the call's. Where this
JAX strides grouped-query keys wrongly in the packed layout (JAX 0.10), the keys and
values are repeated for every query head first.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend
from kerneltune._src.kernel.base import Invocation
from kerneltune.kernels._common import is_hopper
from kerneltune.kernels.attention.backward import every_head
from kerneltune.kernels.attention.jax_nn import cudnn_variant_unsupported
from kerneltune.kernels.attention.masking import Masks

#: Segment slots of the packed layout: the most documents a batch row may hold for this
#: path (more run the fallback). cuDNN treats each slot as a sequence of its own (its
#: softmax statistics are `[B * slots, heads, T]`) and launches work for every slot, so
#: an empty slot is not free.
DOCUMENT_SLOTS = 16


@functools.cache
def _fused() -> Any:
    """JAX's cuDNN attention module (`jax._src.cudnn.fused_attention_stablehlo`) where
    its `dot_product_attention` takes the packed layout, else None."""
    try:
        module = importlib.import_module("jax._src.cudnn.fused_attention_stablehlo")
        params = inspect.signature(module.dot_product_attention).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    if getattr(module, "MaskType", None) is None:
        return None
    return module if {"q_offsets", "kv_offsets", "mask_type"} <= set(params) else None


@functools.cache
def _strides_grouped_keys() -> bool:
    """Whether this JAX's packed layout strides the keys by their own heads. JAX 0.10
    strides them by the queries' heads (`_fix_seqlen_offsets`: `kv_offsets * N * H`),
    which is wrong for grouped-query keys; JAX 0.12 uses the keys' (`N_kv`)."""
    try:
        source = inspect.getsource(_fused()._fix_seqlen_offsets)
    except (AttributeError, OSError, TypeError):
        return False
    return "N_kv" in source


def documents(ids: jax.Array, slots: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The documents of segment ids `[B, T]`, as cuDNN's packed layout takes them.

    A document is a run of equal ids. Returns `lengths [B, slots]` and
    `offsets [B, slots + 1]` (int32; -1 in the slots after the last document) and the
    number of documents `[B]`. Where a row has more documents than `slots`, its last
    slot runs to the end of the row: the caller must not use that row's layout.

    Example:
      >>> ids = jnp.asarray([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
      >>> lengths, offsets, count = documents(ids, 3)
      >>> lengths.tolist(), offsets.tolist(), count.tolist()
      ([[3, 2, 1], [6, -1, -1]], [[0, 3, 5, -1], [0, -1, -1, -1]], [3, 1])
    """
    b, t = ids.shape
    first = jnp.ones((b, 1), bool)
    starts = jnp.concatenate([first, ids[:, 1:] != ids[:, :-1]], axis=1)
    count = jnp.sum(starts, axis=1, dtype=jnp.int32)
    begin = jax.vmap(lambda row: jnp.nonzero(row, size=slots, fill_value=-1)[0])(starts)
    begin = begin.astype(jnp.int32)
    following = jnp.concatenate([begin[:, 1:], jnp.full((b, 1), -1, jnp.int32)], axis=1)
    end = jnp.where(following >= 0, following, t)
    lengths = jnp.where(begin >= 0, end - begin, -1).astype(jnp.int32)
    offsets = jnp.concatenate([begin, jnp.full((b, 1), -1, jnp.int32)], axis=1)
    return lengths, offsets, count


def packable(q_ids: jax.Array, kv_ids: jax.Array, slots: int) -> jax.Array:
    """Whether the packed layout gives exactly "a query attends to the keys of its own
    document" (a scalar bool): the queries' and keys' ids are the same, never decrease
    along a row (so each document is one run, in order) and make at most `slots`
    documents a row."""
    _, _, count = documents(q_ids, slots)
    return _packable(q_ids, kv_ids, count, slots)


def _packable(q_ids: jax.Array, kv_ids: jax.Array, count: jax.Array, slots: int) -> jax.Array:
    """`packable`, given the queries' number of documents a row (`documents`' count)."""
    if q_ids.shape != kv_ids.shape:
        return jnp.asarray(False)
    same = jnp.all(q_ids == kv_ids)
    ordered = jnp.all(q_ids[:, 1:] >= q_ids[:, :-1])
    return same & ordered & jnp.all(count <= slots)


def packed_or(
    packed: Callable[..., jax.Array],
    fallback: Callable[..., jax.Array],
    q_ids: jax.Array,
    kv_ids: jax.Array,
    slots: int,
    *operands: Any,
) -> jax.Array:
    """`packed(lengths, offsets, *operands)` where the ids are packable, else
    `fallback(*operands)`, decided at run time."""
    lengths, offsets, count = documents(q_ids, slots)
    return jax.lax.cond(
        _packable(q_ids, kv_ids, count, slots),
        lambda ops: packed(lengths, offsets, *ops),
        lambda ops: fallback(*ops),
        operands,
    )


def _unsupported(inv: Any) -> str | None:
    """Why the packed layout cannot run a call (None: it can, given packable ids)."""
    q, k, _, bias, masks = inv.args
    kw = inv.kwargs
    if masks.q_segments is None:
        return "the packed layout is for calls with segment ids (packed documents)"
    if _fused() is None:
        return "this JAX's cuDNN wrapper has no packed layout (q_offsets)"
    if not is_hopper():
        return "cuDNN's packed layout needs a Hopper GPU (H100, H200)"
    if q.shape[1] != k.shape[1]:
        return f"packed documents need as many queries as keys, not {q.shape[1]} and {k.shape[1]}"
    if bias is not None or masks.mask is not None:
        return "the packed layout takes no bias or mask besides the segment ids"
    if masks.q_lengths is not None or masks.kv_lengths is not None:
        return "the packed layout takes no sequence lengths besides the segment ids"
    if kw["window"] is not None:
        return "the packed layout takes no local window"
    return cudnn_variant_unsupported(
        q, None, Masks(), causal=kw["causal"], window=None, soft_cap=kw["soft_cap"]
    )


class CudnnPackedBackend(Backend):
    """cuDNN's packed layout for segment ids that are packed documents (Hopper). A call
    whose ids the layout cannot express runs, at run time, the library the kernel's
    `library_cfg` picks for it (tokamax or cuDNN with the dense mask, else XLA)."""

    name = "cudnn_packed"
    differentiated_by_jax = True

    def unusable(self, kernel, inv, cfg) -> str | None:
        return _unsupported(inv)

    def run(self, kernel, q, k, v, bias, masks, *, cfg, causal, sm_scale, window, soft_cap):
        fused = _fused()
        mask_type = fused.MaskType.PADDING_CAUSAL if causal else fused.MaskType.PADDING
        static = {"causal": causal, "sm_scale": sm_scale, "window": window, "soft_cap": soft_cap}
        other = kernel.library_cfg(Invocation(kernel.op_id, (q, k, v, bias, masks), static))
        fallback = kernel.backend_named(other.backend)

        def packed(lengths, offsets, q, k, v):
            if not _strides_grouped_keys():  # this JAX mis-strides grouped-query keys
                k, v = every_head(q, k), every_head(q, v)
            return fused.dot_product_attention(
                q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets,
                kv_offsets=offsets, scale=sm_scale, mask_type=mask_type, qkv_layout="BTNH",
            )  # fmt: skip

        def dense(q, k, v):
            return fallback.run(kernel, q, k, v, bias, masks, cfg=other, **static)

        ids = (masks.q_segments, masks.kv_segments)
        return packed_or(packed, dense, *ids, DOCUMENT_SLOTS, q, k, v)
