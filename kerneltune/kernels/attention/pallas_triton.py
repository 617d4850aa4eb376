"""Flash attention, forward and backward, our Pallas kernels lowered by Triton, with
the blocks, warps and stages chosen by kerneltune.

The forward keeps a block of queries resident and walks the keys a block at a time
with an online softmax, so the scores are never whole; it returns the output and,
for the backward, the base-2 log-sum-exp `[batch, heads, q_len]`. The backward runs
two kernels on those residuals: one keeps a block of keys resident and walks the
queries (dK, dV), the other keeps a block of queries resident and walks the keys
(dQ). A causal call skips the blocks the mask hides (query i sees keys 0..i).

Grouped-query k and v are read in place by the forward (query head h reads kv head
h // group); the backward kernel takes them for every query head.

JAX shipped such kernels in `jax.experimental.pallas.ops.gpu.attention` until 0.12.1
removed them; these are ours, so the backend runs on every JAX kerneltune supports.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kerneltune._src.kernel.backends import Backend
from kerneltune._src.params import BwdParams, FwdParams
from kerneltune.kernels._common import launch_params, pallas_dot
from kerneltune.kernels.attention.backward import BackwardKernelGradient
from kerneltune.kernels.attention.config import bwd_splits_alike
from kerneltune.kernels.attention.reference import LOG2E

F32 = jnp.float32


def _block(wanted: int | None, length: int, default: int, what: str) -> int:
    """`wanted` (or `default`), at most `length`, which it must divide."""
    block = min(wanted or default, length)
    if length % block:
        raise ValueError(
            f"attention: {what}={block} does not divide the sequence length {length}; "
            "choose a block that divides it (the candidate space does)."
        )
    return block


def _seq_spec(length: int, d: int, *, head_of: Any = None) -> pl.BlockSpec:
    """A whole sequence of one head of a `[batch, length, heads, d]` array, for the
    program at grid position `(b, h, i)` (head `head_of(h)`, h by default)."""
    head_of = head_of or (lambda h: h)
    return pl.BlockSpec(
        (pl.squeezed, length, pl.squeezed, d), lambda b, h, i: (b, 0, head_of(h), 0)
    )


def _tile_spec(block: int, d: int) -> pl.BlockSpec:
    """Block i of the sequence of head h of a `[batch, length, heads, d]` array."""
    return pl.BlockSpec((pl.squeezed, block, pl.squeezed, d), lambda b, h, i: (b, i, h, 0))


def _row_spec(length: int | None, block: int) -> pl.BlockSpec:
    """Of a `[batch, heads, length]` statistic: block i, or the whole row (`length`)."""
    if length is not None:
        return pl.BlockSpec((pl.squeezed, pl.squeezed, length), lambda b, h, i: (b, h, 0))
    return pl.BlockSpec((pl.squeezed, pl.squeezed, block), lambda b, h, i: (b, h, i))


def _scores(q, k, q0, k0, *, scale, causal, upcast) -> jax.Array:
    """The scores (base 2) of the tile of queries from `q0` and keys from `k0`, -inf
    where the causal mask hides a key (query i sees keys 0..i)."""
    s = pallas_dot(q, k, upcast=upcast, trans_y=True) * scale
    if not causal:
        return s
    rows = q0 + lax.broadcasted_iota(jnp.int32, s.shape, 0)
    cols = k0 + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    return jnp.where(rows >= cols, s, -jnp.inf)


# --- forward -----------------------------------------------------------------------


def _forward_tile(
    q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, causal, block_q, block_kv, kv_len, upcast
):
    i = pl.program_id(2)
    q = q_ref[...]
    steps = kv_len // block_kv
    if causal:  # the key blocks at or before this query block's last query
        steps = jnp.minimum(steps, pl.cdiv((i + 1) * block_q, block_kv))

    def step(j, carry):
        top, total, acc = carry
        k0 = j * block_kv
        k, v = k_ref[pl.ds(k0, block_kv), :], v_ref[pl.ds(k0, block_kv), :]
        s = _scores(q, k, i * block_q, k0, scale=scale, causal=causal, upcast=upcast)
        new_top = jnp.maximum(top, jnp.max(s, axis=1))
        p = jnp.exp2(s - new_top[:, None])
        shrink = jnp.exp2(top - new_top)
        acc = acc * shrink[:, None] + pallas_dot(p.astype(v.dtype), v, upcast=upcast)
        return new_top, total * shrink + jnp.sum(p, axis=1), acc

    d = q.shape[-1]
    start = (jnp.full((block_q,), -jnp.inf, F32), jnp.zeros((block_q,), F32))
    top, total, acc = lax.fori_loop(0, steps, step, (*start, jnp.zeros((block_q, d), F32)))
    o_ref[...] = (acc / total[:, None]).astype(o_ref.dtype)
    lse_ref[...] = top + jnp.log2(total)


def flash_forward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    cfg: FwdParams,
    causal: bool,
    sm_scale: float,
    interpret: bool,
) -> tuple[jax.Array, jax.Array]:
    """The attention of `q` (`[batch, q_len, heads, d]`) over `k`, `v` (`[batch,
    kv_len, kv_heads, d]`, kv_heads dividing heads) with `cfg`'s blocks, and its
    base-2 log-sum-exp `[batch, heads, q_len]` (float32)."""
    b, q_len, heads, d = q.shape
    kv_len, group = k.shape[1], heads // k.shape[2]
    block_q = _block(cfg.q_blocksize, q_len, 128, "q_blocksize")
    block_kv = _block(cfg.kv_blocksize, kv_len, 128, "kv_blocksize")
    kv_spec = _seq_spec(kv_len, d, head_of=lambda h: h // group)
    return pl.pallas_call(
        functools.partial(
            _forward_tile,
            scale=sm_scale * LOG2E,
            causal=causal,
            block_q=block_q,
            block_kv=block_kv,
            kv_len=kv_len,
            upcast=interpret,
        ),
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((b, heads, q_len), F32),
        ],
        grid=(b, heads, q_len // block_q),
        in_specs=[_tile_spec(block_q, d), kv_spec, kv_spec],
        out_specs=[_tile_spec(block_q, d), _row_spec(None, block_q)],
        compiler_params=launch_params(cfg, interpret=interpret),
        interpret=interpret,
        name="kerneltune_flash_forward",
    )(q, k, v)


# --- backward ----------------------------------------------------------------------


def _probabilities(q, k, lse, q0, k0, *, scale, causal, upcast):
    """The softmax of the tile of queries from `q0` and keys from `k0`, rebuilt from
    the forward's base-2 log-sum-exp (0 where the mask hides a key)."""
    s = _scores(q, k, q0, k0, scale=scale, causal=causal, upcast=upcast)
    return jnp.exp2(s - lse[:, None])


def _dkdv_tile(
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
    *, scale, sm_scale, causal, block_q, block_kv, q_len, upcast,
):  # fmt: skip
    j = pl.program_id(2)
    k0 = j * block_kv
    k, v = k_ref[...], v_ref[...]
    first = k0 // block_q if causal else 0  # the query blocks before see none of these keys

    def step(i, carry):
        dk, dv = carry
        q0 = i * block_q
        rows = pl.ds(q0, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        p = _probabilities(q, k, lse_ref[rows], q0, k0, scale=scale, causal=causal, upcast=upcast)
        dv = dv + pallas_dot(p.astype(do.dtype), do, upcast=upcast, trans_x=True)
        dp = pallas_dot(do, v, upcast=upcast, trans_y=True)
        ds = p * (dp - delta_ref[rows][:, None])
        dk = dk + pallas_dot(ds.astype(q.dtype), q, upcast=upcast, trans_x=True)
        return dk, dv

    zeros = jnp.zeros(k.shape, F32)
    dk, dv = lax.fori_loop(first, q_len // block_q, step, (zeros, zeros))
    dk_ref[...] = (dk * sm_scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_tile(
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref,
    *, scale, sm_scale, causal, block_q, block_kv, kv_len, upcast,
):  # fmt: skip
    i = pl.program_id(2)
    q0 = i * block_q
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    steps = kv_len // block_kv
    if causal:
        steps = jnp.minimum(steps, pl.cdiv(q0 + block_q, block_kv))

    def step(j, dq):
        k0 = j * block_kv
        k, v = k_ref[pl.ds(k0, block_kv), :], v_ref[pl.ds(k0, block_kv), :]
        p = _probabilities(q, k, lse, q0, k0, scale=scale, causal=causal, upcast=upcast)
        ds = p * (pallas_dot(do, v, upcast=upcast, trans_y=True) - delta[:, None])
        return dq + pallas_dot(ds.astype(k.dtype), k, upcast=upcast)

    dq = lax.fori_loop(0, steps, step, jnp.zeros(q.shape, F32))
    dq_ref[...] = (dq * sm_scale).astype(dq_ref.dtype)


def flash_backward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    out: jax.Array,
    lse: jax.Array,
    dout: jax.Array,
    *,
    cfg: BwdParams,
    causal: bool,
    sm_scale: float,
    interpret: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """dq, dk, dv of `flash_forward` (k and v for every query head) from its output and
    log-sum-exp. Each kernel keeps an outer block (`cfg.kv_blocksize`) resident and
    walks inner blocks (`cfg.q_blocksize`): keys resident for dK and dV, queries
    resident for dQ."""
    b, q_len, heads, d = q.shape
    kv_len = k.shape[1]
    # Σ_d out·dout per query: the softmax's Jacobian term, shared by both kernels.
    delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(F32), dout.astype(F32))
    common = {"scale": sm_scale * LOG2E, "sm_scale": sm_scale, "causal": causal}
    launch = launch_params(cfg, interpret=interpret)

    outer = _block(cfg.kv_blocksize, kv_len, 32, "kv_blocksize")
    inner = _block(cfg.q_blocksize, q_len, 32, "q_blocksize")
    every_q, kv_tile, q_stats = _seq_spec(q_len, d), _tile_spec(outer, d), _row_spec(q_len, inner)
    dk, dv = pl.pallas_call(
        functools.partial(
            _dkdv_tile, block_q=inner, block_kv=outer, q_len=q_len, upcast=interpret, **common
        ),
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        grid=(b, heads, kv_len // outer),
        in_specs=[every_q, kv_tile, kv_tile, every_q, q_stats, q_stats],
        out_specs=[kv_tile, kv_tile],
        compiler_params=launch,
        interpret=interpret,
        name="kerneltune_flash_backward_dkdv",
    )(q, k, v, dout, lse, delta)

    outer = _block(cfg.kv_blocksize, q_len, 32, "kv_blocksize")
    inner = _block(cfg.q_blocksize, kv_len, 32, "q_blocksize")
    q_tile, every_kv, tile_stats = (
        _tile_spec(outer, d),
        _seq_spec(kv_len, d),
        _row_spec(None, outer),
    )
    dq = pl.pallas_call(
        functools.partial(
            _dq_tile, block_q=outer, block_kv=inner, kv_len=kv_len, upcast=interpret, **common
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(b, heads, q_len // outer),
        in_specs=[q_tile, every_kv, every_kv, q_tile, tile_stats, tile_stats],
        out_specs=q_tile,
        compiler_params=launch,
        interpret=interpret,
        name="kerneltune_flash_backward_dq",
    )(q, k, v, dout, lse, delta)
    return dq, dk, dv


# --- backends ----------------------------------------------------------------------


class TritonBackend(BackwardKernelGradient):
    """Our flash forward with tuned blocks, lowered by Triton; the backward is the
    `AttentionBackward` kernel (the config's backend is called "pallas")."""

    name = "pallas"
    lowering = "triton"
    interprets = True

    def run(self, kernel, q, k, v, *, cfg: FwdParams, causal: bool, sm_scale: float):
        out, _ = self.fwd_with_residuals(kernel, q, k, v, cfg=cfg, causal=causal, sm_scale=sm_scale)
        return out

    def fwd_with_residuals(self, kernel, q, k, v, *, cfg: FwdParams, causal: bool, sm_scale: float):
        # The residual is the base-2 log-sum-exp the backward kernel takes.
        return flash_forward(
            q, k, v, cfg=cfg, causal=causal, sm_scale=sm_scale, interpret=kernel.use_interpreter()
        )


class TritonBackwardBackend(Backend):
    """Our flash backward with tuned blocks, lowered by Triton."""

    name = "pallas"
    lowering = "triton"
    interprets = True

    def unusable(self, kernel, inv, cfg: BwdParams) -> str | None:
        q_len, kv_len = int(inv.args[0].shape[1]), int(inv.args[1].shape[1])
        if cfg.kv_blocksize is not None and not bwd_splits_alike(q_len, kv_len, cfg):
            return (
                f"kv_blocksize={cfg.kv_blocksize} cuts the sequences ({q_len}, {kv_len}) "
                "into different numbers of blocks"
            )
        return super().unusable(kernel, inv, cfg)

    def run(
        self, kernel, q, k, v, out, lse, dout, *, cfg: BwdParams, causal: bool, sm_scale: float
    ):
        return flash_backward(
            q, k, v, out, lse, dout, cfg=cfg, causal=causal, sm_scale=sm_scale,
            interpret=kernel.use_interpreter(),
        )  # fmt: skip
