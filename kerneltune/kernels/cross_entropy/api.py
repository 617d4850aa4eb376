"""`linear_softmax_cross_entropy`: the public function and its kernel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import keys, tracing
from kerneltune._src.execution.default import default_executor
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import Invocation
from kerneltune._src.tuning.inputs import random_like
from kerneltune.kernels._args import as_array, cast, explicitly_sharded, full, symbolic
from kerneltune.kernels._common import Pruned, interpreted, kernel_for
from kerneltune.kernels.cross_entropy import config as config_lib
from kerneltune.kernels.cross_entropy.chunked_backend import ChunkedBackend
from kerneltune.kernels.cross_entropy.config import CrossEntropyConfig, CrossEntropyProblem
from kerneltune.kernels.cross_entropy.pallas_triton import TritonBackend
from kerneltune.kernels.cross_entropy.reference import REDUCTIONS, XlaBackend, cross_entropy_xla


def problem_of(inv: Invocation[Any, Any]) -> CrossEntropyProblem:
    x, w = inv.args[0], inv.args[2]
    return CrossEntropyProblem(
        m=int(x.shape[0]), k=int(x.shape[1]), v=int(w.shape[1]), dtype=np.dtype(x.dtype)
    )


def check_inputs(op: str, x: Any, labels: Any, w: Any, where: Any, reduction: Any) -> None:
    """Raises a TypeError or ValueError naming the argument that does not fit."""
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    if x.ndim != 2:
        raise ValueError(f"{op}: x must be [tokens, features] (2-D), got shape {x.shape}.")
    if w.ndim != 2 or w.shape[0] != x.shape[1]:
        raise ValueError(
            f"{op}: weights must be [features, vocab] with features = x.shape[1] = "
            f"{x.shape[1]}, got shape {w.shape}."
        )
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype != w.dtype:
        raise TypeError(
            f"{op}: x and weights must share one floating dtype, got {x.dtype} and {w.dtype}."
        )
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"{op}: labels must be an integer array, got dtype {labels.dtype}.")
    if labels.shape != (x.shape[0],):
        raise ValueError(
            f"{op}: labels must have shape ({x.shape[0]},) (one per row of x), got {labels.shape}."
        )
    if where.dtype != jnp.bool_ or where.shape != (x.shape[0],):
        raise ValueError(
            f"{op}: where must be a boolean array of shape ({x.shape[0]},), got "
            f"{where.dtype}{list(where.shape)}."
        )


class LinearSoftmaxCrossEntropy(BackendKernel[CrossEntropyConfig]):
    """`x[M, K] @ w[K, V]` then a softmax cross-entropy against integer labels, with a
    mask, reduced by "sum", "mean" or "none" (float32 out).

    Arguments: `(x, labels, w, where)` and the static `reduction`. Its config picks
    the backend (`CrossEntropyConfig`): XLA materialising the logits (the heuristic,
    and what JAX differentiates itself), chunks of tokens that compute their gradients
    during the forward under a gradient, or the fused Pallas kernel. Calls under a
    gradient are tuned apart, on forward + backward time.
    """

    op_id = "linear_softmax_cross_entropy"
    # 2: logits in the inputs' dtype joined the space and the heuristic (a config tuned
    # under v1 never competed with plain JAX's faster program: it is tuned again).
    # 3: the Pallas log-sum-exp pass joined the chunked configs (`lse_backend`).
    version = "3"
    config_type = CrossEntropyConfig
    tunes_training_apart = True
    backends = (XlaBackend(), ChunkedBackend(), TritonBackend())

    def prepare(self, x: Any, labels: Any, w: Any, where: Any, *, reduction: str = "mean"):
        check_inputs(self.op_id, x, labels, w, where, reduction)
        return (x, labels, w, where), {"reduction": reduction}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> CrossEntropyConfig:
        """On GPUs the chunked path, forward and under a gradient, its log-sum-exp
        taken by the Pallas kernel (interpreted runs and CPUs keep XLA's reduction and,
        for a forward, plain JAX's program: the interpreter is slow at full size; a CPU
        also for a training step whose logits are not too large)."""
        pallas = self.runs_pallas()
        lse: config_lib.LseBackend = "triton" if pallas and not self.use_interpreter() else "xla"
        return config_lib.heuristic(
            problem_of(inv), training=bool(inv.differentiated), lse_backend=lse, pallas=pallas
        )

    def search_space(
        self, inv: Invocation[Any, Any]
    ) -> tuple[list[CrossEntropyConfig], list[Pruned[CrossEntropyConfig]]]:
        return config_lib.candidates(problem_of(inv), training=bool(inv.differentiated))

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[CrossEntropyConfig]:
        return config_lib.interpret_candidates(problem_of(inv))

    def config_across_sizes(self, cfg: Any, sizes: Sequence[int]) -> Any:
        # sizes: x[M, K], labels[M], w[K, V], where[M].
        return config_lib.across_sizes(cfg, int(sizes[0])) if sizes else cfg

    def tuning_inputs(self, inv: Invocation[Any, Any]):
        """Random x and w, labels drawn over the vocabulary, every token counted (the
        default inputs' all-False mask would make the mean 0/0). The weights are scaled
        by 1/√K, as a trained head's are, so the logits are O(1) and the softmax is not
        one-hot (which would hide the rounding of 16-bit logits)."""
        x, labels, w, where = inv.args
        seed = keys.seed_of(inv.call_key)
        x, w = random_like((x, w), seed=seed)
        w = (w * (1.0 / np.sqrt(w.shape[0]))).astype(w.dtype)
        vocab = int(w.shape[1])
        drawn = jax.random.randint(jax.random.PRNGKey(seed), labels.shape, 0, vocab)
        return (x, drawn.astype(labels.dtype), w, jnp.ones(where.shape, bool)), dict(inv.kwargs)

    def reference(self, x, labels, w, where, *, reduction: str) -> jax.Array:
        """The op's math in plain JAX: second derivatives are taken from it."""
        return cross_entropy_xla(x, labels, w, where, reduction=reduction)


#: The loss head with its fused Pallas kernel run by the Pallas interpreter on any
#: device, and a few small candidates: for tests and the CPU demo (timings measure the
#: interpreter, not a GPU).
LinearSoftmaxCrossEntropyInterpret = interpreted(LinearSoftmaxCrossEntropy)


def linear_softmax_cross_entropy(
    x: jax.Array,
    labels: jax.Array,
    weights: jax.Array,
    *,
    reduction: str = "mean",
    where: jax.Array | None = None,
    precision: jax.lax.PrecisionLike = None,
    cfg: CrossEntropyConfig | None = None,
    executor: Any = None,
) -> jax.Array:
    """The loss head of a language model: `x @ weights`, then the softmax
    cross-entropy of each row against its integer label, in float32.

    Per row, `loss = logsumexp(x·W) − (x·W)[label]`. Memory-efficient configs never
    hold the `[M, V]` logits (see `CrossEntropyConfig`). The heuristic writes them in
    x's dtype, as plain JAX's `x @ w` does, and walks chunks of tokens where they would
    be large (the same three matmuls under a gradient, a fraction of the memory); on
    GPUs a Pallas kernel takes each chunk's log-sum-exp. Off GPUs a call that is not
    differentiated runs plain JAX's program, as does, given no `cfg`, a call whose
    arrays are sharded over explicit mesh axes.

    Args:
      x: `[M, K]` floating activations (one row per token).
      labels: `[M]` integers in `[0, V)` (ignored where `where` is False). Every
        backend, and its gradient, reads one outside as `jnp.take_along_axis(...,
        mode="clip")` does: a negative label counts from the end, then it is clipped.
      weights: `[K, V]`; another dtype than x's is promoted with x's as `x @ weights`
        promotes them (refused under strict dtype promotion).
      reduction: "mean" (over the unmasked tokens), "sum", or "none" (per-token
        losses, `[M]`, 0 at masked tokens).
      where: optional boolean `[M]`: False leaves a token out of the loss and the mean.
      precision: the projection's precision, as `jax.lax.dot`'s (tokamax's argument).
        None runs the tuned configs; any other value plain JAX's program with float32
        logits from a dot at that precision.
      cfg: a `CrossEntropyConfig` to use instead of the chosen one.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Returns:
      A float32 scalar, or `[M]` with `reduction="none"`.

    Raises:
      TypeError: labels are not integers; x is not floating.
      ValueError: shapes that do not fit, or an unknown `reduction`.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import linear_softmax_cross_entropy
      >>> x, w = jnp.zeros((4, 8)), jnp.zeros((8, 16))
      >>> round(float(linear_softmax_cross_entropy(x, jnp.arange(4), w)), 4)  # log 16
      2.7726
    """
    op = "linear_softmax_cross_entropy"
    x = as_array(op, "x", x)
    labels = as_array(op, "labels", labels)
    weights = as_array(op, "weights", weights)
    rows = x.shape[0] if x.ndim else 0
    if where is None:
        concrete = not tracing.is_tracing((x, labels, weights))
        mask = full(rows, True, np.dtype(bool), concrete=concrete)
    else:
        mask = as_array(op, "where", where)
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != weights.dtype:
        # float32 weights with bfloat16 activations: promoted as `x @ weights` promotes
        # them (tokamax's; refused under strict dtype promotion, as there).
        dtype = jnp.result_type(x, weights)
        x, weights = cast(x, dtype), cast(weights, dtype)
    check_inputs(op, x, labels, weights, mask, reduction)
    if (
        precision is not None
        or symbolic(x, weights)
        or (cfg is None and explicitly_sharded(x, labels, weights, mask))
    ):
        # A precision the tuned configs do not promise, no shape to key by
        # (`jax.export`), or shardings in the types and no config given (an explicit
        # mesh: the chunked backward slices rows and sums over them): plain JAX's
        # program (the heuristic's logits dtype, without a precision).
        logits = np.dtype(np.float32) if precision is not None else x.dtype
        return cross_entropy_xla(
            x, labels.astype(jnp.int32), weights, mask, reduction=reduction,
            logits_dtype=logits, precision=precision,
        )  # fmt: skip
    ex = executor if executor is not None else default_executor()
    kernel = kernel_for(LinearSoftmaxCrossEntropy, ex)
    return ex(kernel, x, cast(labels, jnp.int32), weights, mask, reduction=reduction, cfg=cfg)  # type: ignore[no-any-return]
