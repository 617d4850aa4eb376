"""`attention`: the public function, the forward kernel and the backward kernel."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src import dispatch
from kerneltune._src.kernel import Invocation, Kernel
from kerneltune._src.params import BwdParams, FwdParams
from kerneltune._src.tuning.inputs import random_like
from kerneltune.kernels._common import BundledKernelMixin, Pruned, kernel_for
from kerneltune.kernels.attention import config as config_lib
from kerneltune.kernels.attention.config import AttentionProblem
from kerneltune.kernels.attention.pallas_triton import mha_backward, mha_forward
from kerneltune.kernels.attention.reference import attention_backward_xla, attention_forward_xla


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


def _check_qkv(op: str, q: Any, k: Any, v: Any) -> None:
    shapes = [tuple(getattr(a, "shape", ())) for a in (q, k, v)]
    if any(len(s) != 4 for s in shapes):
        raise ValueError(
            f"{op}: q, k and v must be [batch, seq, heads, head_dim], got shapes {shapes}."
        )
    (b, _, h, d), (bk, tk, hk, dk), vs = shapes
    if (bk, hk, dk) != (b, h, d) or tuple(vs) != (bk, tk, hk, dk):
        raise ValueError(
            f"{op}: k and v must be [batch, kv_len, heads, head_dim] matching q's batch, "
            f"heads and head_dim; got q {shapes[0]}, k {shapes[1]}, v {shapes[2]}."
        )
    dtypes = {np.dtype(a.dtype) for a in (q, k, v)}
    if len(dtypes) != 1 or not jnp.issubdtype(next(iter(dtypes)), jnp.floating):
        raise TypeError(
            f"{op}: q, k and v must share one floating dtype, got {[str(a.dtype) for a in (q, k, v)]}."
        )


class Attention(BundledKernelMixin, Kernel[FwdParams, jax.Array]):
    """Multi-head attention `softmax(q kᵀ · sm_scale) v` on `[batch, seq, heads,
    head_dim]` arrays: JAX's Pallas `mha` on GPUs, XLA elsewhere.

    Its config (`FwdParams`) is the forward's. The gradient runs `AttentionBackward`
    (op "attention_bwd", config `BwdParams`) through the kernel's executor, so the
    backward is tuned for itself.

    Args:
      op_id: the op id (default "attention").
      executor: the executor the backward kernel runs through (default: the default
        executor).
    """

    op_id = "attention"
    version = "1"
    config_type = FwdParams
    backward_type: ClassVar[type[AttentionBackward]]

    def __init__(
        self, op_id: str | None = None, *, name: str | None = None, executor: Any = None
    ) -> None:
        super().__init__(op_id, name=name)
        self._init_executor(executor)
        self.backward = self.backward_type(executor=executor)

    def prepare(
        self, q: Any, k: Any, v: Any, *, causal: bool = False, sm_scale: float | None = None
    ):
        _check_qkv(self.op_id, q, k, v)
        scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
        return (q, k, v), {"causal": bool(causal), "sm_scale": scale}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> FwdParams:
        return config_lib.fwd_heuristic(problem_of(inv))

    def candidate_cfgs_triton(self, inv: Invocation[Any, Any]) -> list[FwdParams]:
        if self.use_interpreter():
            return config_lib.fwd_interpret_candidates(problem_of(inv))
        return config_lib.fwd_candidates(problem_of(inv))[0]

    def pruned_cfgs(self, inv: Invocation[Any, Any]) -> list[Pruned[FwdParams]]:
        """The forward configs left out of the search, each with its reason."""
        return config_lib.fwd_candidates(problem_of(inv))[1]

    def run_triton(self, q, k, v, *, cfg: FwdParams, causal: bool, sm_scale: float) -> jax.Array:
        return mha_forward(
            q,
            k,
            v,
            cfg=cfg,
            causal=causal,
            sm_scale=sm_scale,
            interpret=self.use_interpreter(),
            return_residuals=False,
        )

    def fwd_with_residuals_triton(self, q, k, v, *, cfg: FwdParams, causal: bool, sm_scale: float):
        out, lse = mha_forward(
            q,
            k,
            v,
            cfg=cfg,
            causal=causal,
            sm_scale=sm_scale,
            interpret=self.use_interpreter(),
            return_residuals=True,
        )
        return out, lse

    def run_xla(self, q, k, v, *, cfg: FwdParams, causal: bool, sm_scale: float) -> jax.Array:
        return attention_forward_xla(q, k, v, causal=causal, sm_scale=sm_scale)[0]

    def fwd_with_residuals_xla(self, q, k, v, *, cfg: FwdParams, causal: bool, sm_scale: float):
        return attention_forward_xla(q, k, v, causal=causal, sm_scale=sm_scale)

    def vjp(self, lse, out, dout, q, k, v, *, cfg: FwdParams, causal: bool, sm_scale: float):
        return self.inner_executor()(
            self.backward,
            q,
            k,
            v,
            out,
            lse,
            dout.astype(out.dtype),
            causal=causal,
            sm_scale=sm_scale,
        )


class AttentionBackward(BundledKernelMixin, Kernel[BwdParams, tuple]):
    """The attention backward pass: `(q, k, v, out, lse, dout) -> (dq, dk, dv)`, where
    `lse` is the forward's base-2 log-sum-exp `[batch, heads, q_len]` (float32).

    Tuned on its own inputs: when called under a trace, `tuning_inputs` draws random
    q, k, v and dout and runs the forward for `out` and `lse`, so the timed backward
    sees consistent residuals.
    """

    op_id = "attention_bwd"
    version = "1"
    config_type = BwdParams
    forward_type: ClassVar[type[Attention]]

    def __init__(
        self, op_id: str | None = None, *, name: str | None = None, executor: Any = None
    ) -> None:
        super().__init__(op_id, name=name)
        self._init_executor(executor)

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

    def candidate_cfgs_triton(self, inv: Invocation[Any, Any]) -> list[BwdParams]:
        if self.use_interpreter():
            return config_lib.bwd_interpret_candidates(problem_of(inv))
        return config_lib.bwd_candidates(problem_of(inv))[0]

    def pruned_cfgs(self, inv: Invocation[Any, Any]) -> list[Pruned[BwdParams]]:
        return config_lib.bwd_candidates(problem_of(inv))[1]

    def tuning_inputs(self, inv: Invocation[Any, Any]):
        q, k, v, _, _, dout = inv.args
        seed = int(inv.call_key[:8], 16)
        q, k, v, dout = random_like((q, k, v, dout), seed=seed)
        causal, sm_scale = inv.kwargs["causal"], inv.kwargs["sm_scale"]
        forward = self.forward_type(executor=self.executor)
        fwd = dispatch.find_method(forward, "fwd_with_residuals")
        assert fwd is not None
        fwd_cfg = config_lib.fwd_heuristic(problem_of(inv))
        out, lse = fwd(q, k, v, cfg=fwd_cfg, causal=causal, sm_scale=sm_scale)
        return (q, k, v, out, lse, dout), dict(inv.kwargs)

    def run_triton(self, q, k, v, out, lse, dout, *, cfg: BwdParams, causal: bool, sm_scale: float):
        return mha_backward(
            q,
            k,
            v,
            out,
            lse,
            dout,
            cfg=cfg,
            causal=causal,
            sm_scale=sm_scale,
            interpret=self.use_interpreter(),
        )

    def run_xla(self, q, k, v, out, lse, dout, *, cfg: BwdParams, causal: bool, sm_scale: float):
        return attention_backward_xla(q, k, v, out, lse, dout, causal=causal, sm_scale=sm_scale)


Attention.backward_type = AttentionBackward
AttentionBackward.forward_type = Attention


class AttentionInterpret(Attention):
    """JAX's Pallas attention run by the Pallas interpreter on any device, with a few
    block shapes as candidates: for tests and the CPU demo (timings measure the
    interpreter, not a GPU)."""

    op_id = "attention-interpret"
    interpret = True
    run_xla = Attention.run_triton
    fwd_with_residuals_xla = Attention.fwd_with_residuals_triton
    candidate_cfgs_xla = Attention.candidate_cfgs_triton


class AttentionBackwardInterpret(AttentionBackward):
    """The backward of `AttentionInterpret`, also interpreted."""

    op_id = "attention_bwd-interpret"
    interpret = True
    run_xla = AttentionBackward.run_triton
    candidate_cfgs_xla = AttentionBackward.candidate_cfgs_triton


AttentionInterpret.backward_type = AttentionBackwardInterpret
AttentionBackwardInterpret.forward_type = AttentionInterpret


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    cfg: FwdParams | None = None,
    executor: Any = None,
) -> jax.Array:
    """Multi-head attention with tuned forward and backward configs.

    Args:
      q: `[batch, q_len, heads, head_dim]`.
      k, v: `[batch, kv_len, heads, head_dim]`, q's dtype.
      causal: query i attends to keys 0..i.
      sm_scale: the scale of the scores (default `1/sqrt(head_dim)`).
      cfg: a `FwdParams` to use instead of the chosen forward config.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Returns:
      `[batch, q_len, heads, head_dim]` in q's dtype.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import attention
      >>> attention(jnp.ones((1, 16, 2, 8)), jnp.ones((1, 16, 2, 8)), jnp.ones((1, 16, 2, 8)),
      ...           causal=True).shape
      (1, 16, 2, 8)
    """
    from kerneltune._src.executor import default_executor

    ex = executor if executor is not None else default_executor()
    return ex(kernel_for(Attention, ex), q, k, v, causal=causal, sm_scale=sm_scale, cfg=cfg)
