"""The memory-bounded backends' shared forward and backward, and the chunked backend.

Neither the chunked backend nor the fused Pallas kernel keeps the `[M, V]` logits:
both give per-row losses and log-sum-exps (`FromRows.rows`), from which the loss and
its gradient follow the same way. Under a gradient with a loss that is one number the
chunked backend computes the gradients during its forward (its cotangent only scales
them); otherwise the backward recomputes the logits chunk by chunk from the
log-sum-exps.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels.cross_entropy import chunked, lse_triton, lse_xla
from kerneltune.kernels.cross_entropy.config import CrossEntropyConfig, logits_dtype
from kerneltune.kernels.cross_entropy.reference import reduce_rows


def lse_pass(cfg: CrossEntropyConfig, *, interpret: bool) -> chunked.LsePass:
    """The chunked backend's log-sum-exp pass that `cfg` names (the Pallas kernel
    where it takes the chunk's logits, else XLA's reduction)."""
    if cfg.lse_backend != "triton":
        return lse_xla.lse_and_label_logit

    def pass_(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
        tiles = lse_triton.tiles_taking(*logits.shape)
        if tiles is None:
            return lse_xla.lse_and_label_logit(logits, labels)
        return lse_triton.lse_and_label_logit(logits, labels, tiles, interpret=interpret)

    return pass_


def row_weights(where: jax.Array, reduction: str) -> jax.Array:
    """The derivative of the reduced loss with respect to each row's loss (float32)."""
    mask = where.astype(jnp.float32)
    # With every row masked the mean is 0/0 (NaN, as jnp.mean's), but no row reaches
    # it: their weights are 0, as the gradient of plain JAX's masked mean gives.
    return mask / jnp.maximum(jnp.sum(mask), 1.0) if reduction == "mean" else mask


def grads_in_forward(cfg: CrossEntropyConfig, reduction: str) -> bool:
    """The chunked path computes the gradients in its forward where the loss is one
    number (its cotangent only scales them); per-token losses' cotangents are only
    known in the backward, which then recomputes the logits."""
    return cfg.backend == "chunked" and reduction != "none"


class FromRows(Backend):
    """A backend that gives per-row losses and log-sum-exps without the logits; the
    loss, its residuals and its gradient follow from them."""

    def rows(self, kernel: Any, x, labels, w, where, cfg: CrossEntropyConfig):
        """Per-row losses (0 where masked) and log-sum-exps, float32 `[M]` each."""
        raise NotImplementedError

    def run(self, kernel, x, labels, w, where, *, cfg: CrossEntropyConfig, reduction: str):
        return reduce_rows(self.rows(kernel, x, labels, w, where, cfg)[0], where, reduction)

    def fwd_with_residuals(
        self, kernel, x, labels, w, where, *, cfg: CrossEntropyConfig, reduction: str
    ) -> tuple[jax.Array, Any]:
        assert cfg.chunk_size is not None
        if grads_in_forward(cfg, reduction):
            losses, dx, dw = chunked.forward_with_grads(
                x,
                labels,
                w,
                where,
                row_weights(where, reduction),
                chunk=cfg.chunk_size,
                logits_dtype=logits_dtype(cfg, x),
                lse_pass=lse_pass(cfg, interpret=kernel.use_interpreter()),
            )
            return reduce_rows(losses, where, reduction), (dx, dw)
        losses, lse = self.rows(kernel, x, labels, w, where, cfg)
        return reduce_rows(losses, where, reduction), lse

    def vjp(
        self, kernel, residuals, out, dout, x, labels, w, where, *, cfg, reduction: str
    ) -> tuple[Any, ...]:
        assert cfg.chunk_size is not None
        if grads_in_forward(cfg, reduction):
            dx, dw = residuals
            scale = dout.astype(jnp.float32)
            # d_W is float32, or already in w's dtype where the call was one chunk.
            dw = (scale * dw.astype(jnp.float32)).astype(w.dtype)
            return (scale * dx).astype(x.dtype), None, dw, None
        if reduction == "none":
            row_scale = dout.astype(jnp.float32) * where.astype(jnp.float32)
        else:
            row_scale = dout.astype(jnp.float32) * row_weights(where, reduction)
        dx, dw = chunked.backward_from_lse(
            x,
            labels,
            w,
            residuals,
            row_scale,
            chunk=cfg.chunk_size,
            logits_dtype=logits_dtype(cfg, x),
        )
        return dx, None, dw, None


class ChunkedBackend(FromRows):
    """A scan over chunks of tokens, each chunk's logits written and reduced (by XLA,
    or by `lse_triton`'s Pallas pass where `lse_backend="triton"`)."""

    name = "chunked"
    plain_jax = True  # with lse_backend="triton" off GPUs, the pass is interpreted

    def unusable(self, kernel, inv, cfg: CrossEntropyConfig) -> str | None:
        if cfg.lse_backend == "triton" and not kernel.use_interpreter():
            from kerneltune._src.core import jax_compat

            return jax_compat.pallas_lowering_missing("triton")
        return None

    def rows(self, kernel, x, labels, w, where, cfg: CrossEntropyConfig):
        assert cfg.chunk_size is not None
        return chunked.forward(
            x,
            labels,
            w,
            where,
            chunk=cfg.chunk_size,
            logits_dtype=logits_dtype(cfg, x),
            lse_pass=lse_pass(cfg, interpret=kernel.use_interpreter()),
        )
