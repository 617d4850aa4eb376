"""The loss head in plain JAX: the logits materialised (the "xla" backend), and the
float32 reference the tests compare with."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._args import explicitly_sharded
from kerneltune.kernels.cross_entropy import lse_xla
from kerneltune.kernels.cross_entropy.config import logits_dtype

Reduction = Literal["sum", "mean", "none"]
REDUCTIONS: tuple[str, ...] = ("sum", "mean", "none")


def reduce_rows(losses: jax.Array, where: jax.Array, reduction: str) -> jax.Array:
    """Per-row float32 losses (masked rows already 0) reduced as `reduction` asks;
    the mean is over the unmasked rows (NaN when there are none, as `jnp.mean`)."""
    if reduction == "none":
        return losses
    total = jnp.sum(losses)
    if reduction == "sum":
        return total
    return total / jnp.sum(where, dtype=jnp.float32)


def row_losses_of_logits(logits: jax.Array, labels: jax.Array, where: jax.Array) -> jax.Array:
    """`logsumexp(logits) − logits[label]` per row, float32, 0 where `where` is False
    (whatever that row's label)."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    if explicitly_sharded(logits):
        # Sharding in types (the vocabulary over an explicit mesh axis): a gather has no
        # sharding JAX can infer; a masked sum over the vocabulary picks the same logit.
        cols = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        at_label = cols == lse_xla.clip_labels(labels, logits.shape[1])[:, None]
        return jnp.where(where, lse - jnp.sum(jnp.where(at_label, logits, 0.0), axis=-1), 0.0)
    picked = jnp.take_along_axis(logits, labels[:, None].astype(jnp.int32), axis=-1, mode="clip")
    return jnp.where(where, lse - picked[:, 0], 0.0)


def cross_entropy_xla(
    x: jax.Array,
    labels: jax.Array,
    w: jax.Array,
    where: jax.Array,
    *,
    reduction: str,
    logits_dtype: jnp.dtype = jnp.float32,
    precision: jax.lax.PrecisionLike = None,
) -> jax.Array:
    """The loss with the `[M, V]` logits materialised (cuBLAS on GPUs), written in
    `logits_dtype` and upcast to float32 for the log-sum-exp: float32 logits, or plain
    JAX's `x @ w` program with the inputs' dtype. `precision` is the dot's."""
    logits = jnp.dot(x, w, precision=precision, preferred_element_type=logits_dtype)
    logits = logits.astype(jnp.float32)
    return reduce_rows(row_losses_of_logits(logits, labels, where), where, reduction)


def cross_entropy_reference(
    x: jax.Array, labels: jax.Array, w: jax.Array, where: jax.Array, *, reduction: str
) -> jax.Array:
    """The same at the highest precision with float32 inputs: what tests compare with."""
    logits = jnp.dot(
        x.astype(jnp.float32), w.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
    )
    return reduce_rows(row_losses_of_logits(logits, labels, where), where, reduction)


class XlaBackend(Backend):
    """The `[M, V]` logits materialised (cuBLAS on GPUs) and differentiated by JAX:
    plain JAX's program and its backward."""

    name = "xla"
    differentiated_by_jax = True
    plain_jax = True

    def run(self, kernel, x, labels, w, where, *, cfg, reduction: str):
        return cross_entropy_xla(
            x, labels, w, where, reduction=reduction, logits_dtype=logits_dtype(cfg, x)
        )
