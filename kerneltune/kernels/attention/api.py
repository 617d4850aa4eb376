"""`attention`: the public function, the forward kernel and the backward kernel."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import keys
from kerneltune._src.execution.default import default_executor
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import Invocation
from kerneltune._src.params import BwdParams, FwdParams
from kerneltune._src.tuning.inputs import random_like
from kerneltune.kernels._args import reshape
from kerneltune.kernels._common import interpreted, kernel_for
from kerneltune.kernels.attention import arguments
from kerneltune.kernels.attention import config as config_lib
from kerneltune.kernels.attention.backward import every_head
from kerneltune.kernels.attention.chunked import explicit_sharding_backend
from kerneltune.kernels.attention.config import AttentionProblem
from kerneltune.kernels.attention.jax_nn import CudnnBackend, XlaBackend
from kerneltune.kernels.attention.masking import Masks
from kerneltune.kernels.attention.pallas_triton import TritonBackend, TritonBackwardBackend
from kerneltune.kernels.attention.reference import (
    ReferenceBackend,
    XlaBackwardBackend,
    attention_forward_chunked,
)
from kerneltune.kernels.attention.tokamax_backend import TokamaxBackend
from kerneltune.kernels.attention.variants import AttentionVariants, VariantConfig


def problem_of(inv: Invocation[Any, Any]) -> AttentionProblem:
    q, k = inv.args[0], inv.args[1]
    b, tq, h, d = (int(s) for s in q.shape)
    return AttentionProblem(
        batch=b,
        q_len=tq,
        kv_len=int(k.shape[1]),
        heads=h,
        head_dim=d,
        dtype=np.dtype(q.dtype),
        causal=bool(inv.kwargs.get("causal", False)),
    )


def _check_qkv(op: str, q: Any, k: Any, v: Any, *, grouped: bool = False) -> None:
    """q, k and v fit one another; with `grouped`, k and v may have fewer heads than
    q (grouped-query attention: their count divides q's)."""
    shapes = [tuple(getattr(a, "shape", ())) for a in (q, k, v)]
    if any(len(s) != 4 for s in shapes):
        raise ValueError(
            f"{op}: q, k and v must be [batch, seq, heads, head_dim], got shapes {shapes}."
        )
    (b, _, h, d), (bk, tk, hk, dk), vs = shapes
    heads_fit = hk == h or (grouped and hk > 0 and h % hk == 0)
    if (bk, dk) != (b, d) or not heads_fit or tuple(vs) != (bk, tk, hk, dk):
        allowed = "a divisor of q's heads" if grouped else "q's heads"
        raise ValueError(
            f"{op}: k and v must be [batch, kv_len, kv_heads, head_dim] matching q's batch "
            f"and head_dim, with kv_heads {allowed}; got q {shapes[0]}, k {shapes[1]}, "
            f"v {shapes[2]}."
        )
    dtypes = {np.dtype(a.dtype) for a in (q, k, v)}
    if len(dtypes) != 1 or not jnp.issubdtype(next(iter(dtypes)), jnp.floating):
        raise TypeError(
            f"{op}: q, k and v must share one floating dtype, got {[str(a.dtype) for a in (q, k, v)]}."
        )


class Attention(BackendKernel[FwdParams]):
    """Multi-head attention `softmax(q kᵀ · sm_scale) v` on `[batch, seq, heads,
    head_dim]` arrays: our Pallas flash attention, cuDNN, XLA or tokamax on GPUs (the config's
    `backend`), XLA elsewhere.

    Its config (`FwdParams`) is the forward's. The Pallas backend's gradient runs
    `AttentionBackward` (op "attention_bwd", config `BwdParams`) through the kernel's
    executor, so the backward is tuned for itself.

    Args:
      op_id: the op id (default "attention").
      executor: the executor the backward kernel runs through (default: the default
        executor).
      interpret: run the Pallas code in the Pallas interpreter (tests, the CPU demo).
    """

    op_id = "attention"
    version = "1"
    config_type = FwdParams
    # cuDNN, tokamax and XLA each bring their own backward, and their forward and
    # backward speeds rank differently (tokamax's forward beats cuDNN's at some shapes,
    # its backward at none): a training call is tuned on forward + backward.
    tunes_training_apart = True
    backends = (
        TritonBackend(),
        CudnnBackend(),
        XlaBackend(),
        TokamaxBackend(),
        ReferenceBackend(),
    )
    fallback = "reference"

    @functools.cached_property
    def backward(self) -> AttentionBackward:
        """The backward kernel, bound to this kernel's executor (and interpreter)."""
        return AttentionBackward(executor=self.executor, interpret=self.interpret)

    def prepare(
        self, q: Any, k: Any, v: Any, *, causal: bool = False, sm_scale: float | None = None
    ):
        _check_qkv(self.op_id, q, k, v, grouped=True)
        scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
        return (q, k, v), {"causal": bool(causal), "sm_scale": scale}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> FwdParams:
        if self.runs_pallas() and not self.use_interpreter():
            return config_lib.gpu_heuristic(
                problem_of(inv), differentiated=bool(inv.differentiated)
            )
        return config_lib.fwd_heuristic(problem_of(inv))

    def search_space(self, inv: Invocation[Any, Any]):
        p = problem_of(inv)
        kept, pruned = config_lib.fwd_candidates(p)
        if inv.differentiated:
            return config_lib.for_training(p, kept, pruned)
        if config_lib.tokamax_causal_forward(p, differentiated=False):
            return config_lib.for_tokamax_causal_forward(p, kept, pruned)
        return config_lib.for_long_sequences(p, kept, pruned)

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[FwdParams]:
        return config_lib.fwd_interpret_candidates(problem_of(inv))

    def reference(self, q, k, v, *, causal: bool, sm_scale: float) -> jax.Array:
        """The op's math in plain JAX: second derivatives are taken from it, and tuning
        validates candidates against it (a chunk of queries at a time on long
        sequences, so it fits where the call does)."""
        k, v = every_head(q, k), every_head(q, v)
        return attention_forward_chunked(q, k, v, causal=causal, sm_scale=sm_scale)


class AttentionBackward(BackendKernel[BwdParams]):
    """The attention backward pass: `(q, k, v, out, lse, dout) -> (dq, dk, dv)`, where
    `lse` is the forward's base-2 log-sum-exp `[batch, heads, q_len]` (float32).

    Tuned on its own inputs: when called under a trace, `tuning_inputs` draws random
    q, k, v and dout and runs the forward for `out` and `lse`, so the timed backward
    sees consistent residuals. `BwdParams.backend` is "pallas" (our Pallas flash backward)
    or "xla" (where the fused kernel cannot split the lengths alike, and where Pallas
    does not run).
    """

    op_id = "attention_bwd"
    version = "1"
    config_type = BwdParams
    backends = (TritonBackwardBackend(), XlaBackwardBackend())

    def prepare(
        self, q, k, v, out, lse, dout, *, causal: bool = False, sm_scale: float | None = None
    ):
        _check_qkv(self.op_id, q, k, v)
        b, tq, h, _ = q.shape
        if tuple(out.shape) != tuple(q.shape) or tuple(dout.shape) != tuple(q.shape):
            raise ValueError(
                f"{self.op_id}: out and dout must be shaped like q {q.shape}, got {out.shape} and {dout.shape}."
            )
        if tuple(lse.shape) != (b, h, tq):
            raise ValueError(
                f"{self.op_id}: lse must be [batch, heads, q_len] = {(b, h, tq)}, got {lse.shape}."
            )
        scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
        return (q, k, v, out, lse, dout), {"causal": bool(causal), "sm_scale": scale}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> BwdParams:
        return config_lib.bwd_heuristic(problem_of(inv))

    def search_space(self, inv: Invocation[Any, Any]):
        return config_lib.bwd_candidates(problem_of(inv))

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[BwdParams]:
        return config_lib.bwd_interpret_candidates(problem_of(inv))

    def tuning_inputs(self, inv: Invocation[Any, Any]):
        q, k, v, _, _, dout = inv.args
        seed = keys.seed_of(inv.call_key)  # a custom key builder's key need not be hex
        q, k, v, dout = random_like((q, k, v, dout), seed=seed)
        causal, sm_scale = inv.kwargs["causal"], inv.kwargs["sm_scale"]
        forward = Attention(executor=self.executor, interpret=self.interpret)
        fwd_cfg = config_lib.fwd_heuristic(problem_of(inv))
        out, lse = forward.fwd_with_residuals(
            q, k, v, cfg=fwd_cfg, causal=causal, sm_scale=sm_scale
        )
        return (q, k, v, out, lse, dout), dict(inv.kwargs)


#: The Pallas attention and its backward run by the Pallas interpreter on any device,
#: with a few block shapes as candidates: for tests and the CPU demo (timings measure
#: the interpreter, not a GPU).
AttentionInterpret = interpreted(Attention)
AttentionBackwardInterpret = interpreted(AttentionBackward)


def _kernel_can_tile(length: int) -> bool:
    """The flash kernel's blocks (up to 128) must tile the sequence. An empty one has
    no block (its backward's heuristic would divide by the length): it runs as a
    variant, whose XLA code JAX differentiates."""
    return length > 0 and (length % 128 == 0 or (length & (length - 1) == 0 and length >= 16))


def attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    *,
    scale: float | jax.Array | None = None,
    is_causal: bool = False,
    query_seq_lengths: jax.Array | None = None,
    key_value_seq_lengths: jax.Array | None = None,
    local_window_size: int | tuple[int, int] | None = None,
    implementation: str | None = None,
    return_residual: bool = False,
    logits_soft_cap: float | None = None,
    query_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    cfg: FwdParams | VariantConfig | None = None,
    executor: Any = None,
) -> Any:
    """`jax.nn.dot_product_attention` with tuned configs, plus a logits soft cap and
    segment ids (packed documents).

    Plain attention (causal or not, grouped-query included, any scale, sequences the
    flash kernel's blocks tile) runs through the `Attention` kernel: cuDNN, our Pallas
    flash attention or tokamax on GPUs, tuned forward and backward. Where no flash
    kernel runs (a CPU) it runs as a variant with no feature: XLA code JAX
    differentiates, forward mode included. A call
    with a bias, a mask, sequence lengths, segment ids, a local window or a soft cap
    runs through `AttentionVariants`: cuDNN or tokamax where they take it, else XLA a
    block of queries at a time, so the `[B, N, T, S]` logits are never whole unless the
    caller passed a bias or mask of that size (or the sequence is one block of 1024
    queries or fewer). Given no `cfg`, arrays sharded over explicit mesh axes run the
    variants' XLA code, which JAX differentiates (docs/ops.md, "Sharding in types").

    What no kernel of ours computes runs as `jax.nn.dot_product_attention` itself, with
    its results and errors: a named `implementation`, `return_residual=True`, query,
    key and value of a dtype that is not floating, a window with a negative side, and
    a head_dim of 0. Such calls take no soft cap or segment ids.

    Args:
      query: `[batch, q_len, heads, head_dim]`, or `[q_len, heads, head_dim]` (each of
        query, key and value may lack leading dimensions; they are then 1).
      key, value: `[batch, kv_len, kv_heads, head_dim]` (or unbatched), query's dtype;
        `kv_heads` divides `heads` (grouped- and multi-query attention).
      bias: added to the logits; broadcasts to `[batch, heads, q_len, kv_len]`.
      mask: boolean, True where a query may attend; broadcasts like `bias`.
      scale: multiplies the logits (default `1/sqrt(head_dim)`); may be traced.
      is_causal: query i attends to keys 0..i.
      query_seq_lengths, key_value_seq_lengths: `[batch]` int32 valid lengths (padding
        after).
      local_window_size: `w` or `(left, right)`: query i attends to keys i−left..i+right.
      implementation: None (kerneltune chooses, tuned), or "xla" or "cudnn": that
        implementation of `jax.nn.dot_product_attention`, called as it is.
      return_residual: also return the log-sum-exp of each query's logits, `[batch,
        q_len, heads]` (without a gradient), as `jax.nn` does; computed by `jax.nn`.
      logits_soft_cap: `cap`, a positive finite number: logits become `cap · tanh(logits / cap)`
        before masking.
      query_segment_ids, kv_segment_ids: (a kerneltune extension) `[batch, q_len]` and
        `[batch, kv_len]` integers, both or neither: a query attends only to keys of
        its own segment (packed documents); combines with every other argument. The
        kernels compare them as int32: 64-bit ids must fit in int32 (ids that differ
        only above bit 31 compare equal).
      cfg: a config to use instead of the chosen one: `FwdParams` for plain attention,
        `VariantConfig` for a variant.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Returns:
      query's shape and dtype; with `return_residual`, `(output, log-sum-exp)`.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import attention
      >>> q = jnp.ones((1, 16, 4, 8))
      >>> kv = jnp.ones((1, 16, 2, 8))
      >>> attention(q, kv, kv, is_causal=True).shape
      (1, 16, 4, 8)
      >>> docs = jnp.array([[0] * 8 + [1] * 8])
      >>> attention(q, kv, kv, is_causal=True, query_segment_ids=docs,
      ...           kv_segment_ids=docs).shape
      (1, 16, 4, 8)
    """
    query = arguments.array("query", query)
    q, k, v = arguments.qkv(query, key, value)
    window = arguments.window(local_window_size)
    unsupported = arguments.only_jax_nn(q, window, implementation, return_residual)
    if unsupported:
        extensions = {
            "logits_soft_cap": logits_soft_cap,
            "query_segment_ids": query_segment_ids,
            "kv_segment_ids": kv_segment_ids,
        }
        given = [name for name, value in extensions.items() if value is not None]
        if given:
            raise ValueError(
                f"attention: {unsupported} runs as jax.nn.dot_product_attention, which "
                f"takes no {' or '.join(given)}."
            )
        plain: Any = jax.nn.dot_product_attention  # (its overloads split on return_residual)
        return plain(
            query, key, value, bias, mask, scale=scale, is_causal=is_causal,
            query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=local_window_size, implementation=implementation,
            return_residual=return_residual,
        )  # fmt: skip
    unbatched = query.ndim < 4
    b, t, n, h = q.shape
    s = k.shape[1]
    full = (b, n, t, s)
    bias = arguments.logits_operand("bias", bias, full, None)
    mask = arguments.logits_operand("mask", mask, full, np.dtype(bool))
    q_segments, kv_segments = arguments.segments(
        query_segment_ids, kv_segment_ids, q.shape, k.shape, unbatched
    )
    masks = Masks(
        mask=mask,
        q_lengths=arguments.lengths("query_seq_lengths", query_seq_lengths, b),
        kv_lengths=arguments.lengths("key_value_seq_lengths", key_value_seq_lengths, b),
        q_segments=q_segments,
        kv_segments=kv_segments,
    )
    if window is not None:  # a reach past every key changes nothing (jax.nn takes it):
        reach = max(t, s)  # held to the longer sequence, positions stay within int32
        window = (min(window[0], reach), min(window[1], reach))
    soft_cap = arguments.soft_cap(logits_soft_cap)
    is_causal = bool(is_causal)  # as jax.nn: any value with a truth value (not traced)
    if scale is None or isinstance(scale, (int, float, np.number)):
        sm_scale = 1.0 / math.sqrt(h) if scale is None else float(scale)
    else:  # a traced scale: fold it into the queries, keep the kernels' static
        q, sm_scale = q * jnp.asarray(scale, q.dtype), 1.0
    sharded = explicit_sharding_backend(q, k, v, bias, masks) if cfg is None else None
    if sharded is not None:  # sharding in types: a variants path JAX differentiates
        cfg = VariantConfig(backend=sharded)
    plain = (
        sharded is None
        and b > 0  # a batch of no rows has no block for the kernel, as an empty sequence
        and bias is None
        and all(m is None for m in masks)
        and window is None
        and soft_cap is None
        and _kernel_can_tile(t)
        and _kernel_can_tile(s)
    )
    ex = executor if executor is not None else default_executor()
    # Where no flash kernel runs (a CPU), plain attention is the variants' XLA code with
    # no feature: blocks of queries sized for the caches, differentiated by JAX
    # (`variants.cpu_config`). A `FwdParams` config asks for the flash kernel.
    flash = ex.kernel_that_runs(kernel_for(Attention, ex)) if plain else None
    if flash is not None and (flash.runs_pallas() or isinstance(cfg, FwdParams)):
        out = ex(flash, q, k, v, causal=is_causal, sm_scale=sm_scale, cfg=cfg)
    else:
        out = ex(kernel_for(AttentionVariants, ex), q, k, v, bias, masks,
                 causal=is_causal, sm_scale=sm_scale, window=window,
                 soft_cap=soft_cap, cfg=cfg)  # fmt: skip
    return reshape(out, query.shape)
