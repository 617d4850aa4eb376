"""Flash attention of our own on Mosaic GPU (Hopper), forward: every variant that
leaves logits out by position or by document (causal, a local window, sequence
lengths, segment ids), with a logit soft cap, skipping the key blocks a query block
cannot see.

A block of `block_q` queries of one head (one warpgroup of 64 rows, wgmma's M, or two
sharing the block's keys) meets the key blocks `[lo, hi)` that
`mosaic_flash_layout.block_ranges` gives it: under a window or causally a band, with
packed documents only the blocks of the block's own documents. Keys and values of the
next block are fetched by TMA while the current one is computed (two slots). The
blocks at the edges are masked logit by logit (`keep`); the run of whole blocks
between them, where `block_ranges` found every logit kept, is not (the masked blocks
are visited first, in one loop, `Visits`).

The log-sum-exp is kept in base 2 (`log2 Σ 2^(c·log2 e)`, c the capped, scaled
logit), the convention of `reference.py`, for the backward in
`mosaic_flash_backward.py`. A query row that keeps no key comes out of the kernel with
a log-sum-exp below `EMPTY_LSE` (`mosaic_flash_api.py` gives it an infinite one for
the backward) and the output the reference gives it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kerneltune.kernels.attention.mosaic_flash_layout import (
    EMPTY_LSE,
    WARPGROUP_ROWS,
    FlashShape,
    Visits,
    grid,
)
from kerneltune.kernels.attention.mosaic_flash_ops import Registers, mosaic_kernel, smem_tile

LOG2E = math.log2(math.e)
#: What a left-out logit becomes (base 2): finite, so a row with every logit left out
#: gives finite weights rather than NaNs, and far below any real logit.
MASKED = -1e30


def keep(shape: FlashShape, q_pos, k_pos, lens, q_seg, k_seg):
    """Which logits of a `[rows, cols]` block take part: `q_pos`, `k_pos` the
    block's query and key positions broadcast to the block; `lens` the batch row's
    `(q_len, kv_len)`; `q_seg`, `k_seg` its segment ids broadcast likewise (None
    without segment ids)."""
    q_len, kv_len = lens
    ok = (k_pos < kv_len) & (q_pos < q_len)
    if shape.causal:
        ok &= q_pos >= k_pos
    if shape.window is not None:
        left, right = shape.window
        ok &= (q_pos <= k_pos + left) & (q_pos >= k_pos - right)
    if q_seg is not None:
        ok &= q_seg == k_seg
    return ok


def capped_logits(shape: FlashShape, s):
    """Raw `q·k` logits to base-2 ones: scaled, soft-capped (`cap·tanh(x / cap)`), times
    log2 e."""
    s = s * jnp.float32(shape.scale)
    if shape.soft_cap is not None:
        cap = jnp.float32(shape.soft_cap)
        s = cap * jnp.tanh(s / cap)
    return s * jnp.float32(LOG2E)


def warpgroups(shape: FlashShape) -> int:
    """Warpgroups of a forward block: `block_q / 64`, each its own rows, sharing the
    block's keys and values (fetched once into shared memory for all of them)."""
    return shape.block_q // WARPGROUP_ROWS


def forward_kernel(shape: FlashShape, interpreted: bool):
    """The kernel body for `plgpu.kernel`: refs `(q, k, v, ranges, lens, q_seg, k_seg,
    alike)` in (`ranges` from `in_work_order`), `(out, lse)` out, then the scratch of
    `forward_scratch`."""
    bq, bkv, d = WARPGROUP_ROWS, shape.block_kv, shape.head_dim
    wgs = warpgroups(shape)
    regs = Registers(interpreted)

    def body(q_ref, k_ref, v_ref, ranges_ref, lens_ref, qseg_ref, kseg_ref, alike_ref, o_ref,
             lse_ref, q_smem, k_smem, v_smem, qseg_smem, kseg_smem, lse_smem, alike_smem,
             q_bar, k_bar, v_bar, consumed):  # fmt: skip
        b = lax.axis_index("batch")
        h = lax.axis_index("heads")
        qi, visits = Visits.of_step(ranges_ref, b, "q_blocks")
        wg = lax.axis_index("wg") if wgs > 1 else 0
        kh = lax.div(h, jnp.int32(shape.groups))
        q0 = qi * shape.block_q + wg * bq  # this warpgroup's first query
        lens = (lens_ref[b, 0], lens_ref[b, 1])
        segmented = shape.segmented
        q_smem, qseg_smem, lse_smem = q_smem.at[wg], qseg_smem.at[wg], lse_smem.at[wg]
        alike_smem = alike_smem.at[wg]

        plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(q0, bq), h], q_smem, q_bar.at[3 * wg])
        if segmented:
            plgpu.copy_gmem_to_smem(qseg_ref.at[b, pl.ds(q0, bq)], qseg_smem, q_bar.at[3 * wg + 1])
        plgpu.copy_gmem_to_smem(alike_ref.at[b, kh], alike_smem, q_bar.at[3 * wg + 2])

        def fetch(j, slot):
            rows = pl.ds(j * bkv, bkv)
            plgpu.copy_gmem_to_smem(k_ref.at[b, rows, kh], k_smem.at[slot], k_bar.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[b, rows, kh], v_smem.at[slot], v_bar.at[slot])
            if segmented:
                plgpu.copy_gmem_to_smem(
                    kseg_ref.at[b, rows], kseg_smem.at[slot], k_bar.at[2 + slot]
                )

        @pl.when((visits.count > 0) & (wg == 0))  # the first warpgroup fetches for all
        def _():
            fetch(visits.block(0), 0)

        plgpu.barrier_wait(q_bar.at[3 * wg])
        q_seg = None
        if segmented:
            plgpu.barrier_wait(q_bar.at[3 * wg + 1])
            q_seg = lax.broadcast_in_dim(regs.rows(qseg_smem), (bq, bkv), [0])
        rows_iota, cols_iota = regs.iota((bq, bkv), 0), regs.iota((bq, bkv), 1)
        row_layout = plgpu.Layout.WGMMA.reduce(1)
        m_i = regs.cast(jnp.full((bq,), MASKED, jnp.float32), row_layout)
        l_i = regs.cast(jnp.full((bq,), 0.0, jnp.float32), row_layout)
        acc = regs.cast(jnp.full((bq, d), 0.0, jnp.float32), plgpu.Layout.WGMMA)

        def step(n, carry, masked):
            acc, m_i, l_i = carry
            j, slot = visits.block(n), lax.rem(n, 2)

            @pl.when((n + 1 < visits.count) & (wg == 0))
            def _():
                if wgs > 1:  # every warpgroup is done with the slot's previous block

                    @pl.when(n > 0)
                    def _():
                        plgpu.barrier_wait(consumed.at[1 - slot])

                fetch(visits.block(n + 1), 1 - slot)

            plgpu.barrier_wait(k_bar.at[slot])

            s = capped_logits(shape, regs.matmul(q_smem, k_smem.at[slot], transpose_b=True))
            if segmented:  # every copy's barrier is waited on, to keep its phase
                plgpu.barrier_wait(k_bar.at[2 + slot])
            if masked:
                k_seg = None
                if segmented:
                    k_seg = lax.broadcast_in_dim(regs.cols(kseg_smem.at[slot]), (bq, bkv), [1])
                ok = keep(shape, rows_iota + q0, cols_iota + j * bkv, lens, q_seg, k_seg)
                s = jnp.where(ok, s, jnp.float32(MASKED))
            m_new = jnp.maximum(m_i, s.max(axis=1))
            alpha = jnp.exp2(m_i - m_new)
            p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
            l_i = l_i * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            plgpu.barrier_wait(v_bar.at[slot])

            acc = regs.matmul(p.astype(v_ref.dtype), v_smem.at[slot], acc=acc)
            if wgs > 1:
                plgpu.barrier_arrive(consumed.at[slot])
            return acc, m_new, l_i

        acc, m_i, l_i = visits.run(step, (acc, m_i, l_i))
        if wgs > 1:
            # The first warpgroup waits on a slot's release before refilling it, from
            # the second step to the last but one: the releases of the last two steps
            # are left. It waits on them here, so that it observes every phase of each
            # barrier once (JAX's Mosaic GPU interpreter checks that; with 3 or more
            # blocks a block, it failed before).
            for back in (2, 1):

                @pl.when((wg == 0) & (visits.count >= back))
                def _(back=back):
                    plgpu.barrier_wait(consumed.at[lax.rem(visits.count - back, 2)])

        l_safe = jnp.maximum(l_i, jnp.float32(1e-30))
        # A row that kept no key (its max is still `MASKED`) comes out as the reference
        # gives it here, so that XLA needs no pass over the output: zero past the
        # query's length, else every key weighed alike (`alike`, the mean of the values).
        kept = m_i > jnp.float32(EMPTY_LSE)
        inv_l = jnp.where(kept, 1.0 / l_safe, jnp.float32(0.0))
        in_length = jnp.where(rows_iota + q0 < lens[0], jnp.float32(1.0), jnp.float32(0.0))
        fill = jnp.where(kept, jnp.float32(0.0), in_length.max(axis=1))
        plgpu.barrier_wait(q_bar.at[3 * wg + 2])
        alike = lax.broadcast_in_dim(regs.cols(alike_smem), acc.shape, [1])
        acc = acc * lax.broadcast_in_dim(inv_l, acc.shape, [0])
        acc = acc + lax.broadcast_in_dim(fill, acc.shape, [0]) * alike
        q_smem[...] = acc.astype(o_ref.dtype)
        lse_smem[...] = m_i + jnp.log2(l_safe)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, o_ref.at[b, pl.ds(q0, bq), h])
        plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, h, pl.ds(q0, bq)])
        plgpu.wait_smem_to_gmem(0)

    return body


def forward_scratch(shape: FlashShape, dtype):
    bkv, d, wgs = shape.block_kv, shape.head_dim, warpgroups(shape)
    return [
        smem_tile((wgs, WARPGROUP_ROWS, d), dtype),
        smem_tile((2, bkv, d), dtype),
        smem_tile((2, bkv, d), dtype),
        plgpu.SMEM((wgs, WARPGROUP_ROWS), jnp.int32),
        plgpu.SMEM((2, bkv), jnp.int32),
        plgpu.SMEM((wgs, WARPGROUP_ROWS), jnp.float32),
        plgpu.SMEM((wgs, d), jnp.float32),
        plgpu.Barrier(num_barriers=3 * wgs),  # per warpgroup: queries, their ids, `alike`
        plgpu.Barrier(num_barriers=4),
        plgpu.Barrier(num_barriers=2),
        # Each warpgroup arrives when done with a slot; the first waits before refilling.
        plgpu.Barrier(num_arrivals=wgs, num_barriers=2),
    ]


def flash_forward(shape: FlashShape, q, k, v, ranges, lens, q_seg, k_seg, alike, *, interpret=None):
    """`(out [B, T, N, D], lse [B, N, T])` of padded inputs (see `FlashShape`); `alike`
    `[B, K, D]` float32, what a query within its length that keeps no key gets (the
    reference's: the mean of the unpadded values)."""
    b, t, n, d = q.shape
    out_type = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((b, n, t), jnp.float32),
    )
    wgs = warpgroups(shape)
    dims, names = grid(shape, n, t // shape.block_q, b, "q_blocks")
    return mosaic_kernel(
        forward_kernel(shape, interpret is not None),
        out_type=out_type,
        scratch_types=forward_scratch(shape, q.dtype),
        grid=dims,
        grid_names=names,
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=interpret,
        num_threads=wgs if wgs > 1 else None,
        thread_name="wg" if wgs > 1 else None,
    )(q, k, v, ranges, lens, q_seg, k_seg, alike)
