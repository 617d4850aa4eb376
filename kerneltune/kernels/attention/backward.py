"""The gradient of the backends that save the log-sum-exp (our Pallas kernel and the
XLA fallback): `AttentionBackward`, a kernel of its own tuned for itself, run through
the forward kernel's executor; and the grouped-query helpers both passes use."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend


def every_head(q: jax.Array, kv: jax.Array) -> jax.Array:
    """Grouped-query k or v repeated for every query head (as is when they match).

    Broadcast and merged, not `jnp.repeat`: under `jax.set_mesh` of explicit axes,
    `jnp.repeat` along heads sharded over a mesh axis raises (it wants an
    `out_sharding`), where the merge keeps the heads' sharding."""
    b, s, kv_heads, h = kv.shape
    groups = q.shape[2] // kv_heads
    if groups == 1:
        return kv
    every = jnp.broadcast_to(kv[:, :, :, None], (b, s, kv_heads, groups, h))
    return every.reshape(b, s, kv_heads * groups, h)


def sum_over_groups(d: jax.Array, kv: jax.Array) -> jax.Array:
    """A cotangent for every query head, summed back to `kv`'s grouped heads."""
    b, s, n, h = d.shape
    kh = kv.shape[2]
    if kh == n:
        return d
    total = d.reshape(b, s, kh, n // kh, h).sum(axis=3, dtype=jnp.float32)
    return total.astype(kv.dtype)


class BackwardKernelGradient(Backend):
    """A forward backend whose residual is the log-sum-exp and whose backward is the
    `AttentionBackward` kernel (`kernel.backward`)."""

    # The backward kernels take no part of this config: tuned at their own keys.
    backward_tuned_apart = True

    def vjp(self, kernel: Any, lse, out, dout, q, k, v, *, cfg, causal: bool, sm_scale: float):
        # The backward kernel works on every query head; a group's k and v cotangents
        # are the sums over its query heads.
        dq, dk, dv = kernel.inner_executor()(
            kernel.backward,
            q,
            every_head(q, k),
            every_head(q, v),
            out,
            lse,
            dout.astype(out.dtype),
            causal=causal,
            sm_scale=sm_scale,
        )
        return dq, sum_over_groups(dk, k), sum_over_groups(dv, v)
