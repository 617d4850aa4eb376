"""The loss head over chunks of tokens, in plain JAX (a `lax.scan`).

Under a gradient the chunked forward also computes each chunk's gradients — the
softmax minus the one-hot label, then `d_x` and the chunk's `d_W` contribution,
accumulated in float32 — so that the backward pass only scales them by the incoming
cotangent: the logits are multiplied out three times in all, as in plain JAX, but only
one chunk's `[chunk, V]` intermediates exist at a time. A call that is not
differentiated runs the forward alone. `backward_from_lse` is the backward that
recomputes each chunk's logits from the saved log-sum-exp instead (for per-token
losses, whose cotangent is only known in the backward, and for the fused kernel).

`logits_dtype` is the dtype each chunk's matmul writes its logits in (float32, or the
inputs' dtype as plain JAX's `x @ w`); the log-sum-exp and the gradients are taken in
float32 either way. `lse_pass` reads each chunk's logits as written for each row's
log-sum-exp and label logit: XLA's reduction (`lse_xla`, the default) or the Pallas
kernel (`lse_triton`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from kerneltune.kernels.cross_entropy import lse_xla

#: `(logits [rows, V] as written, labels [rows]) -> (log-sum-exp, label logit)`, float32.
LsePass = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def _in_chunks(chunk: int, *rows: jax.Array) -> list[jax.Array]:
    """Each `[M, ...]` array zero-padded to a multiple of `chunk` rows and reshaped to
    `[M / chunk, chunk, ...]` (padded rows must carry a zero weight or a False mask)."""
    m = rows[0].shape[0]
    chunk = max(1, min(chunk, m))  # a chunk larger than the call is one chunk, not padding
    pad = (-m) % chunk
    out = []
    for a in rows:
        if pad:
            a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
        out.append(a.reshape((-1, chunk, *a.shape[1:])))
    return out


def _logits(xc: jax.Array, w: jax.Array, logits_dtype: jnp.dtype) -> jax.Array:
    """One chunk's logits as the matmul writes them (read back as float32 by their
    consumers: XLA fuses the upcast into each)."""
    return jnp.dot(xc, w, preferred_element_type=logits_dtype)


def _softmax_grad(
    logits: jax.Array, lse: jax.Array, labels: jax.Array, scale: jax.Array
) -> jax.Array:
    """The logits' float32 gradient for per-row loss weights `scale`:
    `(softmax − one-hot) · scale` (the logits read as float32)."""
    probs = jnp.exp(logits.astype(jnp.float32) - lse[:, None])
    cols = lax.broadcasted_iota(jnp.int32, probs.shape, 1)
    # The one-hot of the label the forward picked: a label outside [0, V) is clipped
    # there, so the raw one would match no column and leave the one-hot out.
    picked = lse_xla.clip_labels(labels, probs.shape[1])
    return (probs - (cols == picked[:, None]).astype(jnp.float32)) * scale[:, None]


def _products(
    xc: jax.Array, w: jax.Array, g: jax.Array, dw_dtype: jnp.dtype
) -> tuple[jax.Array, jax.Array]:
    """`(d_x f32, d_W in dw_dtype)` from the logits' gradient `g`. The products run in
    the weights' dtype (tensor cores for bf16), accumulating in f32."""
    g = g.astype(w.dtype)
    dx = jnp.dot(g, w.T, preferred_element_type=jnp.float32)
    return dx, jnp.dot(xc.T, g, preferred_element_type=dw_dtype)


def _logit_grads(
    xc: jax.Array,
    lc: jax.Array,
    w: jax.Array,
    logits: jax.Array,
    lse: jax.Array,
    scale: jax.Array,
    dw_dtype: jnp.dtype = jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    """One chunk's `(d_x [chunk, K] f32, d_W [K, V] in dw_dtype)` from its logits."""
    return _products(xc, w, _softmax_grad(logits, lse, lc, scale), dw_dtype)


#: The one chunk's logits are turned into their gradient in this many steps of rows.
GRADIENT_STEPS = 8


def _one_chunk_grads(
    x: jax.Array,
    labels: jax.Array,
    w: jax.Array,
    written: jax.Array,
    lse: jax.Array,
    scale: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """`(d_x f32, d_W in w's dtype)` of a call that is one chunk, from its logits as the
    matmul `written` them. Where they are in the weights' dtype the gradient is written
    over them, in `GRADIENT_STEPS` steps of rows (a loop whose carry is the logits: XLA
    updates a loop's carried buffer in place): one `[M, V]` buffer instead of two, 2
    GiB less at 8192 tokens and a 128k vocabulary."""
    m = x.shape[0]
    if written.dtype != w.dtype or m % GRADIENT_STEPS:
        return _logit_grads(x, labels, w, written, lse, scale, dw_dtype=w.dtype)
    rows = m // GRADIENT_STEPS

    def step(i: jax.Array, buf: jax.Array) -> jax.Array:
        r0 = i * rows
        logits, row_lse, row_labels, row_scale = (
            lax.dynamic_slice_in_dim(a, r0, rows) for a in (buf, lse, labels, scale)
        )
        g = _softmax_grad(logits, row_lse, row_labels, row_scale)
        return lax.dynamic_update_slice_in_dim(buf, g.astype(buf.dtype), r0, 0)

    return _products(x, w, lax.fori_loop(0, GRADIENT_STEPS, step, written), w.dtype)


def _losses(
    lse_pass: LsePass, logits: jax.Array, labels: jax.Array, where: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """One chunk's per-row losses (`lse - label logit`, 0 where masked) and lse."""
    lse, picked = lse_pass(logits, labels)
    return jnp.where(where, lse - picked, 0.0), lse


def forward(
    x: jax.Array,
    labels: jax.Array,
    w: jax.Array,
    where: jax.Array,
    *,
    chunk: int,
    logits_dtype: jnp.dtype = jnp.float32,
    lse_pass: LsePass = lse_xla.lse_and_label_logit,
) -> tuple[jax.Array, jax.Array]:
    """Per-row float32 losses (0 where masked) and log-sum-exps, chunk by chunk."""
    m = x.shape[0]
    xs, ls, ws = _in_chunks(chunk, x, labels, where)

    def step(carry: None, c: tuple[jax.Array, ...]) -> tuple[None, tuple[jax.Array, jax.Array]]:
        xc, lc, wc = c
        return None, _losses(lse_pass, _logits(xc, w, logits_dtype), lc, wc)

    _, (losses, lse) = lax.scan(step, None, (xs, ls, ws))
    return losses.reshape(-1)[:m], lse.reshape(-1)[:m]


def forward_with_grads(
    x: jax.Array,
    labels: jax.Array,
    w: jax.Array,
    where: jax.Array,
    row_weight: jax.Array,
    *,
    chunk: int,
    logits_dtype: jnp.dtype = jnp.float32,
    lse_pass: LsePass = lse_xla.lse_and_label_logit,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-row losses, and the gradients of `sum(row_weight · losses)` with respect to
    `x` (float32) and `w` (float32, or w's dtype when the call is one chunk), in one
    pass over the chunks."""
    m, k = x.shape
    if m <= chunk:
        # One chunk: no scan, and d_W is written once, in the weights' dtype, as plain
        # JAX's backward writes it: no float32 `K × V` sum, nor its conversion after.
        written = jnp.dot(x, w, preferred_element_type=logits_dtype)
        losses, lse = _losses(lse_pass, written, labels, where)
        dx, dw = _one_chunk_grads(x, labels, w, written, lse, row_weight)
        return losses, dx, dw
    xs, ls, ws, rs = _in_chunks(chunk, x, labels, where, row_weight)

    def step(dw: jax.Array, c: tuple[jax.Array, ...]):
        xc, lc, wc, rc = c
        logits = _logits(xc, w, logits_dtype)
        losses, lse = _losses(lse_pass, logits, lc, wc)
        dx_c, dw_c = _logit_grads(xc, lc, w, logits, lse, rc)
        return dw + dw_c, (losses, dx_c)

    dw0 = jnp.zeros(w.shape, jnp.float32)
    dw, (losses, dx) = lax.scan(step, dw0, (xs, ls, ws, rs))
    return losses.reshape(-1)[:m], dx.reshape(-1, k)[:m], dw


def backward_from_lse(
    x: jax.Array,
    labels: jax.Array,
    w: jax.Array,
    lse: jax.Array,
    row_scale: jax.Array,
    *,
    chunk: int,
    logits_dtype: jnp.dtype = jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    """`(d_x, d_W)` in x's and w's dtypes for per-row loss cotangents `row_scale`,
    recomputing each chunk's logits; `lse` is the forward's per-row log-sum-exp.

    Logits written in fewer bits than float32 take the log-sum-exp of the recomputed
    logits instead: XLA may keep such logits unrounded in one program and not in the
    other (`xla_allow_excess_precision`, on by default), and the forward's log-sum-exp
    of other logits gave a softmax that does not sum to one (bfloat16 on a CPU: with
    one class, gradients up to 0.2 where they are 0)."""
    m, k = x.shape
    own_lse = jnp.dtype(logits_dtype).itemsize < 4
    if m <= chunk:  # one chunk: no scan, d_W written once in w's dtype
        written = jnp.dot(x, w, preferred_element_type=logits_dtype)
        lse = lse_xla.lse_and_label_logit(written, labels)[0] if own_lse else lse
        dx, dw = _one_chunk_grads(x, labels, w, written, lse, row_scale)
        return dx.astype(x.dtype), dw
    xs, ls, es, rs = _in_chunks(chunk, x, labels, lse, row_scale)

    def step(dw: jax.Array, c: tuple[jax.Array, ...]):
        xc, lc, ec, rc = c
        logits = _logits(xc, w, logits_dtype)
        ec = lse_xla.lse_and_label_logit(logits, lc)[0] if own_lse else ec
        dx_c, dw_c = _logit_grads(xc, lc, w, logits, ec, rc)
        return dw + dw_c, dx_c

    dw, dx = lax.scan(step, jnp.zeros(w.shape, jnp.float32), (xs, ls, es, rs))
    return dx.reshape(-1, k)[:m].astype(x.dtype), dw.astype(w.dtype)
