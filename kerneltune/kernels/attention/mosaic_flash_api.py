"""`flash_attention_mosaic`: the Mosaic GPU flash kernels (`mosaic_flash.py`,
`mosaic_flash_backward.py`) as one differentiable function of an attention variant's
call, with what the kernels leave to XLA:

- padding the sequences to whole blocks (the padded keys are masked by length, the
  padded queries cut away);
- which key blocks each query block visits, the blocks with the most visits first
  (`mosaic_flash_layout`);
- rows that keep no key: as in `jax.nn.dot_product_attention`, a query past its
  length comes out zero, and any other query that keeps no key (its document has no
  key, a window that reaches none) weighs every key alike. The kernels give such rows
  no weight in the backward; the keys' share of the uniform weights is added here.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import jax_compat
from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._common import is_hopper
from kerneltune.kernels.attention.masking import Masks
from kerneltune.kernels.attention.mosaic_flash_layout import (
    EMPTY_LSE,
    WARPGROUP_ROWS,
    FlashShape,
    block_ranges,
    in_work_order,
)


def _pad(x: jax.Array, axis: int, to: int, value=0) -> jax.Array:
    if x.shape[axis] == to:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, to - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


def flash_attention_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    masks: Masks,
    *,
    scale: float,
    causal: bool,
    window: tuple[int, int] | None,
    soft_cap: float | None,
    block_q: int = 64,
    block_kv: int = 64,
    interpret=None,
) -> jax.Array:
    """Attention over `[B, T, N, D]` queries and `[B, S, K, D]` keys and values (16-bit,
    `D` a multiple of 64) with `masks`' lengths and segment ids (no dense mask), a
    window, a soft cap; `interpret`: JAX's Mosaic GPU interpreter's params (CPU tests).
    """
    b, t, n, d = q.shape
    s, kheads = k.shape[1], k.shape[2]
    segmented = masks.q_segments is not None
    if window is not None:  # a reach past both sequences changes nothing: kept in int32
        window = (min(window[0], t + s), min(window[1], t + s))
    shape = FlashShape(
        block_q=block_q, block_kv=block_kv, head_dim=d, groups=n // kheads, causal=causal,
        window=window, soft_cap=soft_cap, scale=float(scale), segmented=segmented,
    )  # fmt: skip
    tp, sp = _round_up(t, block_q), _round_up(s, block_kv)
    q_len = jnp.full((b,), t, jnp.int32) if masks.q_lengths is None else masks.q_lengths
    kv_len = jnp.full((b,), s, jnp.int32) if masks.kv_lengths is None else masks.kv_lengths
    lens = jnp.stack([jnp.clip(q_len, 0, t), jnp.clip(kv_len, 0, s)], axis=1).astype(jnp.int32)
    if masks.q_segments is not None and masks.kv_segments is not None:
        q_seg = _pad(masks.q_segments.astype(jnp.int32), 1, tp, -1)
        # Padded keys sort after every document, so ordered ids stay ordered.
        k_seg = _pad(masks.kv_segments.astype(jnp.int32), 1, sp, np.iinfo(np.int32).max)
    else:  # unread by the kernels, which take the arrays all the same
        q_seg = jnp.zeros((b, tp), jnp.int32)
        k_seg = jnp.zeros((b, sp), jnp.int32)
    padded = Masks(
        q_segments=q_seg if segmented else None, kv_segments=k_seg if segmented else None
    )
    # The forward's blocks of queries may span several warpgroups; the backward's are
    # one warpgroup's (its dk, dv kernel walks them as the columns of its tiles).
    backward_shape = dataclasses.replace(shape, block_q=WARPGROUP_ROWS)
    kv_ranges, q_ranges = block_ranges(backward_shape, lens, padded, tp, sp)
    kv_ranges, q_ranges = in_work_order(kv_ranges), in_work_order(q_ranges)
    fwd_ranges = (
        kv_ranges
        if shape == backward_shape
        else in_work_order(block_ranges(shape, lens, padded, tp, sp)[0])
    )
    run = _differentiable(shape, backward_shape, s, interpret)
    out = run(
        _pad(q, 1, tp),
        _pad(k, 1, sp),
        _pad(v, 1, sp),
        fwd_ranges,
        kv_ranges,
        q_ranges,
        lens,
        q_seg,
        k_seg,
    )
    return out[:, :t]


@functools.cache
def _differentiable(shape: FlashShape, backward_shape: FlashShape, s: int, interpret):
    """The kernels under one `custom_vjp` for a shape (`s` the unpadded key length).

    Each kernel is called through one jitted function per shape: a program that calls
    attention at the same shapes again (every layer of a model that is not scanned)
    traces each kernel once and JAX lowers it once, where each call would otherwise
    lower its own copy (about half a second of Python a Mosaic GPU kernel)."""
    # The kernels import JAX's Mosaic GPU (a third of a second): imported here, where a
    # kernel is first built, rather than by everyone who imports kerneltune.
    from kerneltune.kernels.attention.mosaic_flash import flash_forward
    from kerneltune.kernels.attention.mosaic_flash_backward import flash_backward

    forward_kernel = jax.jit(functools.partial(flash_forward, shape, interpret=interpret))
    backward_kernel = jax.jit(
        functools.partial(flash_backward, backward_shape, interpret=interpret)
    )

    def forward(q, k, v, ranges, lens, q_seg, k_seg):
        # Rows that keep no key come out of the kernel as the reference gives them
        # (zero past the query's length, else `alike`): no pass over the output here.
        alike = jnp.mean(v[:, :s], axis=1, dtype=jnp.float32)  # [B, K, D]
        out, lse = forward_kernel(q, k, v, ranges, lens, q_seg, k_seg, alike)
        t = q.shape[1]
        valid = jnp.arange(t)[None] < lens[:, :1]  # [B, T]
        empty = (lse < EMPTY_LSE) & valid[:, None]  # [B, N, T]
        lse = jnp.where(empty | ~valid[:, None], jnp.inf, lse)
        return out, (lse, empty)

    @jax.custom_vjp
    def run(q, k, v, fwd_ranges, kv_ranges, q_ranges, lens, q_seg, k_seg):
        return forward(q, k, v, fwd_ranges, lens, q_seg, k_seg)[0]

    def run_fwd(q, k, v, fwd_ranges, kv_ranges, q_ranges, lens, q_seg, k_seg):
        out, (lse, empty) = forward(q, k, v, fwd_ranges, lens, q_seg, k_seg)
        res = (q, k, v, out, lse, empty, fwd_ranges, kv_ranges, q_ranges, lens, q_seg, k_seg)
        return out, res

    def run_bwd(res, do):
        q, k, v, out, lse, empty, fwd_ranges, kv_ranges, q_ranges, lens, q_seg, k_seg = res
        delta = jnp.einsum("btnd,btnd->bnt", do.astype(jnp.float32), out.astype(jnp.float32))
        dq, dk, dv = backward_kernel(
            q, k, v, do, lse, delta, kv_ranges, q_ranges, lens, q_seg, k_seg
        )
        # The empty rows' uniform weights: each of the first `s` keys gets 1/s of them.
        b, t, n, d = do.shape
        spread = jnp.where(jnp.moveaxis(empty, 1, 2)[..., None], do.astype(jnp.float32), 0.0)
        spread = spread.sum(axis=1).reshape(b, k.shape[2], shape.groups, d).sum(axis=2) / s
        keys = (jnp.arange(k.shape[1]) < s)[None, :, None, None]
        dv = (dv.astype(jnp.float32) + jnp.where(keys, spread[:, None], 0.0)).astype(dv.dtype)
        zero = lambda x: np.zeros(x.shape, jax.dtypes.float0)  # noqa: E731
        ints = (fwd_ranges, kv_ranges, q_ranges, lens, q_seg, k_seg)
        return (dq, dk, dv, *map(zero, ints))

    run.defvjp(run_fwd, run_bwd)
    return run


#: The dtypes the kernels take (wgmma's 16-bit inputs).
DTYPES = (np.dtype("float16"), np.dtype("bfloat16"))


class MosaicFlashBackend(Backend):
    """`flash_attention_mosaic` (Hopper; in JAX's Mosaic GPU interpreter elsewhere when
    asked): causal, window, lengths, segment ids and a soft cap, no bias or dense
    mask. Its `custom_vjp` runs the backward kernels; JAX differentiates around it."""

    name = "mosaic"
    differentiated_by_jax = True
    lowering = "mosaic_gpu"
    interprets = True

    def unusable(self, kernel, inv, cfg) -> str | None:
        q, k, _, bias, masks = inv.args
        if 0 in (q.shape[0], q.shape[1], k.shape[1]):  # a grid of no blocks
            return "kerneltune's Mosaic flash kernel takes no empty sequence or batch"
        if bias is not None or masks.mask is not None:
            return "kerneltune's Mosaic flash kernel takes no bias or dense mask"
        if np.dtype(q.dtype) not in DTYPES or np.dtype(k.dtype) != np.dtype(q.dtype):
            return f"kerneltune's Mosaic flash kernel takes float16 or bfloat16, not {q.dtype}"
        if q.shape[-1] % 64 or q.shape[-1] > 128:
            return f"kerneltune's Mosaic flash kernel takes head dims 64 and 128, not {q.shape[-1]}"
        if not isinstance(inv.kwargs["sm_scale"], (int, float)):
            return "kerneltune's Mosaic flash kernel takes a static scale"
        if kernel.use_interpreter():
            if jax_compat.mosaic_gpu_interpret_params() is None:
                return "this JAX has no Mosaic GPU interpreter"
        elif not is_hopper():
            return "kerneltune's Mosaic flash kernel runs on Hopper GPUs (H100, H200)"
        return super().unusable(kernel, inv, cfg)

    def run(self, kernel, q, k, v, bias, masks, *, cfg, causal, sm_scale, window, soft_cap):
        interpret = jax_compat.mosaic_gpu_interpret_params() if kernel.use_interpreter() else None
        return flash_attention_mosaic(
            q, k, v, masks, scale=sm_scale, causal=causal, window=window, soft_cap=soft_cap,
            block_q=cfg.block_q, block_kv=cfg.block_kv, interpret=interpret,
        )  # fmt: skip
