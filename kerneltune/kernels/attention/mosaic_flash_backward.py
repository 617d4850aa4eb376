"""The backward of `mosaic_flash.py`'s forward on Mosaic GPU: two kernels, as flash
attention's backward is usually split.

- `dq`: a block of queries of one head walks its key blocks (the forward's ranges),
  recomputing the probabilities from the saved base-2 log-sum-exp.
- `dk, dv`: a block of keys of one key head walks, for each query head of its group,
  the query blocks whose ranges hold it (`mosaic_flash_layout.block_ranges`), so a
  grouped-query call sums its heads in registers, not in memory.

The inputs of the next step are fetched by TMA while the current one is computed (two
slots). With a soft cap `c = cap·tanh(x / cap)` the gradient of a logit is scaled by
`1 − (c / cap)²`. Rows the forward found empty, and padded ones, come with a
log-sum-exp of +inf: their probabilities are 0 here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kerneltune.kernels.attention.mosaic_flash import LOG2E, MASKED, capped_logits, keep
from kerneltune.kernels.attention.mosaic_flash_layout import FlashShape, Visits, grid
from kerneltune.kernels.attention.mosaic_flash_ops import Registers, mosaic_kernel, smem_tile


def _logit_gradient(shape: FlashShape, p, dp, delta, s):
    """d loss / d (scaled logit) from the probabilities `p`, `dp = dO·Vᵀ`, the rows'
    `delta = Σ dO·O` (broadcast) and the base-2 logits `s` (for the soft cap)."""
    ds = p * (dp - delta)
    if shape.soft_cap is not None:
        # c / cap, in [-1, 1] for a kept logit; a masked one (p = 0) is clipped so
        # that its 0 · (1 − huge²) is not NaN.
        capped = jnp.clip(s * jnp.float32(1 / (LOG2E * shape.soft_cap)), -1.0, 1.0)
        ds = ds * (1.0 - capped * capped)
    return ds


def dq_kernel(shape: FlashShape, interpreted: bool):
    bq, bkv, d = shape.block_q, shape.block_kv, shape.head_dim
    regs = Registers(interpreted)

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, ranges_ref, lens_ref, qseg_ref,
             kseg_ref, dq_ref, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
             qseg_smem, kseg_smem, q_bar, k_bar):  # fmt: skip
        b = lax.axis_index("batch")
        h = lax.axis_index("heads")
        qi, visits = Visits.of_step(ranges_ref, b, "q_blocks")
        kh = lax.div(h, jnp.int32(shape.groups))
        q0 = qi * bq
        lens = (lens_ref[b, 0], lens_ref[b, 1])
        rows = pl.ds(q0, bq)

        plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem, q_bar.at[0])
        plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h], do_smem, q_bar.at[1])
        plgpu.copy_gmem_to_smem(lse_ref.at[b, h, rows], lse_smem, q_bar.at[2])
        plgpu.copy_gmem_to_smem(delta_ref.at[b, h, rows], delta_smem, q_bar.at[3])
        if shape.segmented:
            plgpu.copy_gmem_to_smem(qseg_ref.at[b, rows], qseg_smem, q_bar.at[4])

        def fetch(j, slot):
            keys = pl.ds(j * bkv, bkv)
            plgpu.copy_gmem_to_smem(k_ref.at[b, keys, kh], k_smem.at[slot], k_bar.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[b, keys, kh], v_smem.at[slot], k_bar.at[2 + slot])
            if shape.segmented:
                plgpu.copy_gmem_to_smem(
                    kseg_ref.at[b, keys], kseg_smem.at[slot], k_bar.at[4 + slot]
                )

        @pl.when(visits.count > 0)
        def _():
            fetch(visits.block(0), 0)

        for i in range(5 if shape.segmented else 4):
            plgpu.barrier_wait(q_bar.at[i])
        tile = (bq, bkv)
        lse = lax.broadcast_in_dim(regs.rows(lse_smem), tile, [0])
        delta = lax.broadcast_in_dim(regs.rows(delta_smem), tile, [0])
        q_seg = lax.broadcast_in_dim(regs.rows(qseg_smem), tile, [0]) if shape.segmented else None
        q_pos, k_iota = regs.iota(tile, 0) + q0, regs.iota(tile, 1)
        dq = regs.cast(jnp.full((bq, d), 0.0, jnp.float32), plgpu.Layout.WGMMA)

        def step(n, dq, masked):
            j, slot = visits.block(n), lax.rem(n, 2)

            @pl.when(n + 1 < visits.count)
            def _():
                fetch(visits.block(n + 1), 1 - slot)

            plgpu.barrier_wait(k_bar.at[slot])
            s = capped_logits(shape, regs.matmul(q_smem, k_smem.at[slot], transpose_b=True))
            if shape.segmented:  # every copy's barrier is waited on, to keep its phase
                plgpu.barrier_wait(k_bar.at[4 + slot])
            if masked:
                k_seg = None
                if shape.segmented:
                    k_seg = lax.broadcast_in_dim(regs.cols(kseg_smem.at[slot]), tile, [1])
                ok = keep(shape, q_pos, k_iota + j * bkv, lens, q_seg, k_seg)
                s = jnp.where(ok, s, jnp.float32(MASKED))
            p = jnp.exp2(s - lse)
            plgpu.barrier_wait(k_bar.at[2 + slot])
            dp = regs.matmul(do_smem, v_smem.at[slot], transpose_b=True)
            ds = _logit_gradient(shape, p, dp, delta, s)
            return regs.matmul(ds.astype(k_ref.dtype), k_smem.at[slot], acc=dq)

        dq = visits.run(step, dq) * jnp.float32(shape.scale)
        q_smem[...] = dq.astype(dq_ref.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[b, rows, h])
        plgpu.wait_smem_to_gmem(0)

    return body


def dq_scratch(shape: FlashShape, dtype):
    bq, bkv, d = shape.block_q, shape.block_kv, shape.head_dim
    return [
        smem_tile((bq, d), dtype),
        smem_tile((bq, d), dtype),
        smem_tile((2, bkv, d), dtype),
        smem_tile((2, bkv, d), dtype),
        plgpu.SMEM((bq,), jnp.float32),
        plgpu.SMEM((bq,), jnp.float32),
        plgpu.SMEM((bq,), jnp.int32),
        plgpu.SMEM((2, bkv), jnp.int32),
        plgpu.Barrier(num_barriers=5),
        plgpu.Barrier(num_barriers=6),
    ]


def dkv_kernel(shape: FlashShape, interpreted: bool):
    bq, bkv, d, g = shape.block_q, shape.block_kv, shape.head_dim, shape.groups
    regs = Registers(interpreted)

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, ranges_ref, lens_ref, qseg_ref,
             kseg_ref, dk_ref, dv_ref, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
             qseg_smem, kseg_smem, k_bar, q_bar):  # fmt: skip
        b = lax.axis_index("batch")
        kh = lax.axis_index("heads")
        kj, visits = Visits.of_step(ranges_ref, b, "kv_blocks")
        k0 = kj * bkv
        blocks = visits.count
        lens = (lens_ref[b, 0], lens_ref[b, 1])
        keys = pl.ds(k0, bkv)

        plgpu.copy_gmem_to_smem(k_ref.at[b, keys, kh], k_smem, k_bar.at[0])
        plgpu.copy_gmem_to_smem(v_ref.at[b, keys, kh], v_smem, k_bar.at[1])
        if shape.segmented:
            plgpu.copy_gmem_to_smem(kseg_ref.at[b, keys], kseg_smem, k_bar.at[2])

        def fetch(t, slot):
            # Step t: query head kh·g + t // blocks, the query block of visit t % blocks.
            h = kh * g + lax.div(t, blocks)
            rows = pl.ds(visits.block(lax.rem(t, blocks)) * bq, bq)
            plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem.at[slot], q_bar.at[slot])
            plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h], do_smem.at[slot], q_bar.at[2 + slot])
            plgpu.copy_gmem_to_smem(lse_ref.at[b, h, rows], lse_smem.at[slot], q_bar.at[4 + slot])
            plgpu.copy_gmem_to_smem(
                delta_ref.at[b, h, rows], delta_smem.at[slot], q_bar.at[6 + slot]
            )
            if shape.segmented:
                plgpu.copy_gmem_to_smem(
                    qseg_ref.at[b, rows], qseg_smem.at[slot], q_bar.at[8 + slot]
                )

        steps = g * blocks

        @pl.when(steps > 0)
        def _():
            fetch(0, 0)

        for i in range(3 if shape.segmented else 2):
            plgpu.barrier_wait(k_bar.at[i])
        tile = (bkv, bq)  # keys are the rows here, queries the columns
        k_pos, q_iota = regs.iota(tile, 0) + k0, regs.iota(tile, 1)
        k_seg = lax.broadcast_in_dim(regs.rows(kseg_smem), tile, [0]) if shape.segmented else None
        zeros = regs.cast(jnp.full((bkv, d), 0.0, jnp.float32), plgpu.Layout.WGMMA)

        def step(n, carry, masked, head):
            # Step t = head · blocks + n: query head kh·g + head, the block of visit n.
            dk, dv = carry
            t = head * blocks + n
            i, slot = visits.block(n), lax.rem(t, 2)

            @pl.when(t + 1 < steps)
            def _():
                fetch(t + 1, 1 - slot)

            q0 = i * bq
            plgpu.barrier_wait(q_bar.at[slot])
            s = capped_logits(shape, regs.matmul(k_smem, q_smem.at[slot], transpose_b=True))
            if shape.segmented:  # every copy's barrier is waited on, to keep its phase
                plgpu.barrier_wait(q_bar.at[8 + slot])
            if masked:
                q_seg = None
                if shape.segmented:
                    q_seg = lax.broadcast_in_dim(regs.cols(qseg_smem.at[slot]), tile, [1])
                ok = keep(shape, q_iota + q0, k_pos, lens, q_seg, k_seg)
                s = jnp.where(ok, s, jnp.float32(MASKED))
            plgpu.barrier_wait(q_bar.at[4 + slot])
            p = jnp.exp2(s - lax.broadcast_in_dim(regs.cols(lse_smem.at[slot]), tile, [1]))
            plgpu.barrier_wait(q_bar.at[2 + slot])
            dv = regs.matmul(p.astype(v_ref.dtype), do_smem.at[slot], acc=dv)
            dp = regs.matmul(v_smem, do_smem.at[slot], transpose_b=True)
            plgpu.barrier_wait(q_bar.at[6 + slot])
            delta = lax.broadcast_in_dim(regs.cols(delta_smem.at[slot]), tile, [1])
            ds = _logit_gradient(shape, p, dp, delta, s)
            dk = regs.matmul(ds.astype(k_ref.dtype), q_smem.at[slot], acc=dk)
            return dk, dv

        def one_head(head, carry):
            return visits.run(functools.partial(step, head=head), carry)

        dk, dv = lax.fori_loop(0, g, one_head, (zeros, zeros))
        k_smem[...] = (dk * jnp.float32(shape.scale)).astype(dk_ref.dtype)
        v_smem[...] = dv.astype(dv_ref.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[b, keys, kh])
        plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[b, keys, kh])
        plgpu.wait_smem_to_gmem(0)

    return body


def dkv_scratch(shape: FlashShape, dtype):
    bq, bkv, d = shape.block_q, shape.block_kv, shape.head_dim
    return [
        smem_tile((bkv, d), dtype),
        smem_tile((bkv, d), dtype),
        smem_tile((2, bq, d), dtype),
        smem_tile((2, bq, d), dtype),
        plgpu.SMEM((2, bq), jnp.float32),
        plgpu.SMEM((2, bq), jnp.float32),
        plgpu.SMEM((2, bq), jnp.int32),
        plgpu.SMEM((bkv,), jnp.int32),
        plgpu.Barrier(num_barriers=3),
        plgpu.Barrier(num_barriers=10),
    ]


def flash_backward(
    shape: FlashShape, q, k, v, do, lse, delta, kv_ranges, q_ranges, lens, q_seg, k_seg, *,
    interpret=None,
):  # fmt: skip
    """`(dq, dk, dv)` of padded inputs: `lse` the forward's (+inf on rows without a
    key), `delta = Σ_d dO·O` `[B, N, T]` in float32."""
    b, t, n, d = q.shape
    s, kheads = k.shape[1], k.shape[2]
    params = plgpu.CompilerParams(approx_math=True)
    args = (q, k, v, do, lse, delta)
    dims, names = grid(shape, n, t // shape.block_q, b, "q_blocks")
    dq = mosaic_kernel(
        dq_kernel(shape, interpret is not None),
        out_type=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_types=dq_scratch(shape, q.dtype),
        grid=dims,
        grid_names=names,
        compiler_params=params,
        interpret=interpret,
    )(*args, kv_ranges, lens, q_seg, k_seg)
    dkv_dims, dkv_names = grid(shape, kheads, s // shape.block_kv, b, "kv_blocks")
    dk, dv = mosaic_kernel(
        dkv_kernel(shape, interpret is not None),
        out_type=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        scratch_types=dkv_scratch(shape, q.dtype),
        grid=dkv_dims,
        grid_names=dkv_names,
        compiler_params=params,
        interpret=interpret,
    )(*args, q_ranges, lens, q_seg, k_seg)
    return dq, dk, dv
