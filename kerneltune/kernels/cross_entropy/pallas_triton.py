"""The fused loss-head forward in Pallas, lowered through Triton on GPUs.

Each program owns `block_m` rows. It walks the vocabulary in blocks of `block_v`
columns; for each it multiplies the rows' `x` by that block of `w` (stepping the shared
dimension by `block_k`, accumulating in float32) and folds the logit tile into a running
maximum and sum of exponentials per row (an online log-sum-exp, `lse_triton.fold_tile`),
picking out each row's label logit on the way. Only two floats per row leave the kernel: the `[M, V]` logits
are never stored.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kerneltune.kernels._common import launch_params, pad_to
from kerneltune.kernels.cross_entropy import lse_triton, lse_xla
from kerneltune.kernels.cross_entropy.chunked_backend import FromRows
from kerneltune.kernels.cross_entropy.config import CrossEntropyConfig


def _lse_kernel(
    x_ref, w_ref, labels_ref, lse_ref, picked_ref, *, vocab, block_v, block_k, k_steps,
    v_steps, upcast,
):  # fmt: skip
    rows = x_ref.shape[0]
    labels = labels_ref[...]

    def vocab_step(j, stats):
        v0 = pl.multiple_of(j * block_v, block_v)

        def k_step(i, acc):
            k0 = pl.multiple_of(i * block_k, block_k)
            xt = x_ref[:, pl.ds(k0, block_k)]
            wt = w_ref[pl.ds(k0, block_k), pl.ds(v0, block_v)]
            if upcast:  # the interpreter on CPUs: XLA:CPU has no bf16 x bf16 -> f32 dot
                xt, wt = xt.astype(jnp.float32), wt.astype(jnp.float32)
            return acc + jnp.dot(xt, wt, preferred_element_type=jnp.float32)

        logits = lax.fori_loop(0, k_steps, k_step, jnp.zeros((rows, block_v), jnp.float32))
        cols = v0 + lax.broadcasted_iota(jnp.int32, (rows, block_v), 1)
        logits = jnp.where(cols < vocab, logits, -jnp.inf)  # padded vocabulary columns
        return lse_triton.fold_tile(stats, logits, cols, labels)

    stats = lax.fori_loop(0, v_steps, vocab_step, lse_triton.empty_stats(rows))
    running_max, running_sum, picked = stats
    lse_ref[...] = lse_triton.finish(running_max, running_sum)
    picked_ref[...] = picked


def lse_and_label_logit(
    x: jax.Array,
    labels: jax.Array,
    w: jax.Array,
    cfg: CrossEntropyConfig,
    *,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Per-row `logsumexp(x @ w)` and `(x @ w)[row, label]`, float32 `[M]` each.

    Dimensions the tiles do not divide are zero-padded (padded vocabulary columns are
    masked out of the log-sum-exp; the candidate space prefers tiles that divide).
    Labels are picked as `lse_xla.clip_labels` says.
    """
    assert cfg.block_m and cfg.block_v and cfg.block_k
    m, k = x.shape
    vocab = w.shape[1]
    xp = pad_to(x, (cfg.block_m, cfg.block_k))
    wp = pad_to(w, (cfg.block_k, cfg.block_v))
    # Labels picked as every backend picks them (`lse_xla.clip_labels`): a raw label
    # outside [0, V) would match no column and pick 0.
    lp = pad_to(lse_xla.clip_labels(labels, vocab), (cfg.block_m,))
    mp, kp = xp.shape
    vp = wp.shape[1]
    kernel = functools.partial(
        _lse_kernel,
        vocab=vocab,
        block_v=cfg.block_v,
        block_k=cfg.block_k,
        k_steps=kp // cfg.block_k,
        v_steps=vp // cfg.block_v,
        upcast=interpret,
    )
    row = jax.ShapeDtypeStruct((mp,), jnp.float32)
    lse, picked = pl.pallas_call(
        kernel,
        out_shape=(row, row),
        grid=(mp // cfg.block_m,),
        in_specs=[
            pl.BlockSpec((cfg.block_m, kp), lambda i: (i, 0)),
            pl.BlockSpec((kp, vp), lambda i: (0, 0)),
            pl.BlockSpec((cfg.block_m,), lambda i: (i,)),
        ],
        out_specs=(
            pl.BlockSpec((cfg.block_m,), lambda i: (i,)),
            pl.BlockSpec((cfg.block_m,), lambda i: (i,)),
        ),
        compiler_params=launch_params(cfg, interpret=interpret),
        interpret=interpret,
        name="kerneltune_linear_softmax_cross_entropy",
    )(xp, wp, lp)
    return lse[:m], picked[:m]


class TritonBackend(FromRows):
    """The fused Pallas kernel: a running log-sum-exp per row over blocks of the
    vocabulary, never a stored logit; its backward recomputes the logits chunk by chunk
    from the saved log-sum-exp."""

    name = "triton"
    lowering = "triton"
    interprets = True

    def rows(self, kernel, x, labels, w, where, cfg: CrossEntropyConfig):
        lse, picked = lse_and_label_logit(x, labels, w, cfg, interpret=kernel.use_interpreter())
        return jnp.where(where, lse - picked, 0.0), lse
