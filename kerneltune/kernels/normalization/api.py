"""`layer_norm` and `rms_norm`: the public functions and their kernels."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import tracing
from kerneltune._src.execution.default import default_executor
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import Invocation
from kerneltune.kernels._args import (
    as_array,
    axes_last,
    cast,
    explicitly_sharded,
    feature_param,
    floating,
    full,
    normalize_axes,
    symbolic,
    to_rows,
)
from kerneltune.kernels._common import interpreted, kernel_for
from kerneltune.kernels._flattened import call_flattened
from kerneltune.kernels.normalization import config as config_lib
from kerneltune.kernels.normalization.config import NormConfig, NormProblem
from kerneltune.kernels.normalization.pallas_triton import TritonBackend
from kerneltune.kernels.normalization.reference import XlaBackend, layer_norm_xla, rms_norm_xla


def problem_of(inv: Invocation[Any, Any]) -> NormProblem:
    return NormProblem.of(inv.args[0])


class _Norm(BackendKernel[NormConfig]):
    """What layer norm and RMS norm share: config, backends, candidates, argument
    checks."""

    version = "1"
    config_type = NormConfig
    backends = (XlaBackend(), TritonBackend())
    # A Pallas norm brings its Pallas backward, which the forward's time does not
    # show: on an H200 a layer norm 6% faster forward made a GPT block's training
    # step 9% slower. A call under a gradient is tuned on forward + backward.
    tunes_training_apart = True
    #: Which norm the backends compute: "layer_norm" or "rms_norm".
    which: ClassVar[str] = ""
    _params: tuple[str, ...] = ()

    def prepare(self, x: Any, *params: Any, eps: float = 1e-5):
        if getattr(x, "ndim", 0) < 1 or not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(
                f"{self.op_id}: x must be a floating-point array with at least one dimension, got {x!r:.80}."
            )
        if len(params) != len(self._params):
            raise TypeError(
                f"{self.op_id} takes x, {', '.join(self._params)}; got {1 + len(params)} arrays."
            )
        for pname, p in zip(self._params, params):
            if tuple(getattr(p, "shape", ())) != (x.shape[-1],):
                raise ValueError(
                    f"{self.op_id}: {pname} must have shape ({x.shape[-1]},), got {getattr(p, 'shape', p)}."
                )
        return (x, *params), {"eps": float(eps)}

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> NormConfig:
        # The interpreter runs JAX's tiles; elsewhere XLA's fusion is the untuned
        # choice (on GPUs, what an untuned call must not lose to).
        p = problem_of(inv)
        # (float64 rows always: the Pallas kernel computes in float32.)
        if self.runs_pallas() and self.use_interpreter() and p.dtype.itemsize <= 4:
            return config_lib.heuristic(p)
        return config_lib.XLA

    def search_space(self, inv: Invocation[Any, Any]):
        return config_lib.candidates(problem_of(inv))

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[NormConfig]:
        return config_lib.interpret_candidates(problem_of(inv))

    def config_across_sizes(self, cfg: Any, sizes: Sequence[int]) -> Any:
        # sizes: x[rows, width], then each parameter's [width].
        return config_lib.across_widths(cfg, int(sizes[1])) if len(sizes) > 1 else cfg

    def reference(self, x, *params, eps: float):
        """The op's math in plain JAX: second derivatives are taken from it."""
        return self.backend_named("xla").run(self, x, *params, cfg=config_lib.XLA, eps=eps)


class LayerNorm(_Norm):
    """Layer norm over the last axis: our Pallas GPU kernel with a tuned block size
    and warp count on GPUs (and our Pallas backward), XLA elsewhere."""

    op_id = "layer_norm"
    which = "layer_norm"
    _params = ("weight", "bias")


class RMSNorm(_Norm):
    """RMS norm over the last axis (`x / rms(x) · weight`): our Pallas GPU kernel
    with a tuned block size and warp count on GPUs, XLA elsewhere."""

    op_id = "rms_norm"
    which = "rms_norm"
    _params = ("weight",)


#: The norms' Pallas paths run by the Pallas interpreter on any device (tests, the
#: CPU demo; timings measure the interpreter).
LayerNormInterpret = interpreted(LayerNorm)
RMSNormInterpret = interpreted(RMSNorm)


def _number(op: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: {name} must be a Python number, got {value!r:.60}.")
    return float(value)


def _epsilon(op: str, epsilon: Any) -> float:
    eps = _number(op, "epsilon", epsilon)
    if not eps >= 0:
        raise ValueError(f"{op}: epsilon must be >= 0, got {epsilon}.")
    return eps


def _normalize(
    kernel_cls: type[_Norm],
    xla_fn: Callable[..., jax.Array],
    x: Any,
    params: tuple[tuple[str, Any, float], ...],
    axis: int | tuple[int, ...],
    epsilon: Any,
    scale_offset: Any,
    cfg: NormConfig | None,
    executor: Any,
) -> jax.Array:
    """Runs a row-wise norm kernel over `axis` of `x`: the normalised axes are moved
    last and flattened, missing parameters become their identity (`fill`), a given
    scale is shifted by `scale_offset` (tokamax's), and the computation runs in the
    result dtype of `x` and the given parameters (as flax). `xla_fn(x, *params,
    eps=...)` is the kernel's XLA code."""
    op = kernel_cls.op_id
    x = as_array(op, "x", x)
    if x.ndim < 1:
        raise ValueError(f"{op}: x must have at least one dimension, got shape {x.shape}.")
    floating(op, "x", x)
    eps = _epsilon(op, epsilon)
    shift = _number(op, "scale_offset", scale_offset)
    axes = normalize_axes(op, axis, x.ndim)
    given = [(name, feature_param(op, name, v, x, axes), fill) for name, v, fill in params]
    dtype = jnp.result_type(x, *(p for _, p, _ in given if p is not None))
    xd = cast(x, dtype)
    n = math.prod(x.shape[a] for a in axes)
    concrete = not tracing.is_tracing((x, [p for _, p, _ in given]))
    arrays = [
        cast(p, dtype) if p is not None else full(n, fill, dtype, concrete=concrete)
        for _, p, fill in given
    ]
    if shift and given[0][1] is not None:  # the scale, shifted in float32 at least
        wide = dtype if jnp.finfo(dtype).bits >= 32 else jnp.float32
        arrays[0] = (given[0][1].astype(wide) + shift).astype(dtype)
    if cfg is None and explicitly_sharded(x, *arrays):
        # Sharding in types (an explicit mesh): XLA's norm in x's own layout, the
        # normalised axes moved last (rows would merge sharded axes).
        moved, unmove = axes_last(xd, axes)
        features = moved.shape[x.ndim - len(axes) :]
        shaped = [p.reshape(features) for p in arrays]
        return unmove(xla_fn(moved, *shaped, eps=eps, features=len(axes)))
    rows, back = to_rows(xd, axes)
    if symbolic(x):  # no shape to key by (`jax.export`): XLA's norm, plain JAX
        return back(xla_fn(rows, *arrays, eps=eps))
    ex = executor if executor is not None else default_executor()
    out = call_flattened(
        ex,
        kernel_for(kernel_cls, ex),
        rows,
        *arrays,
        eps=eps,
        cfg=cfg,
        # Over the last axis alone the XLA code runs on `x` as it is.
        flattened=x.ndim > 2 and axes == (x.ndim - 1,),
        unflattened={"xla": lambda: xla_fn(xd, *arrays, eps=eps)},
    )
    return back(out)


def layer_norm(
    x: jax.Array,
    scale: jax.Array | None = None,
    bias: jax.Array | None = None,
    *,
    axis: int | tuple[int, ...] = -1,
    epsilon: float = 1e-6,
    scale_offset: float = 0.0,
    subtract_mean: bool = True,
    cfg: NormConfig | None = None,
    executor: Any = None,
) -> jax.Array:
    """Layer norm with a tuned config, as flax's `LayerNorm` computes it:
    `(x − mean) / sqrt(var + epsilon) · scale + bias` over `axis`.

    Args:
      x: a floating array.
      scale: the shape of the normalised axes (`[n]` for one axis), or None (no
        scaling).
      bias: the same shape as `scale`, or None (no offset).
      axis: the axis or axes to normalise over.
      epsilon: added to the variance.
      scale_offset: added to `scale` before it scales (tokamax's; `1.0` for a scale
        stored as `1 + scale`, as in Gemma); unused without a `scale`.
      subtract_mean: False leaves the mean in (tokamax's RMS norm form): `rms_norm`
        (its kernels and config) plus `bias`.
      cfg: a `NormConfig` to use instead of the chosen one.
      executor: the executor to run through (default: `kerneltune.default_executor()`).

    Returns:
      `x`'s shape, in the result dtype of `x`, `scale` and `bias`.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import layer_norm
      >>> y = layer_norm(jnp.arange(8.0).reshape(2, 4))
      >>> tuple(round(float(v), 3) for v in y[0])
      (-1.342, -0.447, 0.447, 1.342)
    """
    if not isinstance(subtract_mean, (bool, np.bool_)):
        raise TypeError(f"layer_norm: subtract_mean must be a bool, got {subtract_mean!r:.60}.")
    if subtract_mean:
        params = (("scale", scale, 1.0), ("bias", bias, 0.0))
        return _normalize(
            LayerNorm, layer_norm_xla, x, params, axis, epsilon, scale_offset, cfg, executor
        )
    out = rms_norm(
        x, scale, axis=axis, epsilon=epsilon, scale_offset=scale_offset, cfg=cfg,
        executor=executor,
    )  # fmt: skip
    if bias is None:
        return out
    axes = normalize_axes("layer_norm", axis, out.ndim)
    b = feature_param("layer_norm", "bias", bias, out, axes)
    dtype = jnp.result_type(out, b)
    shape = [out.shape[a] if a in axes else 1 for a in range(out.ndim)]
    return out.astype(dtype) + b.astype(dtype).reshape(shape)  # type: ignore[union-attr]


def rms_norm(
    x: jax.Array,
    scale: jax.Array | None = None,
    *,
    axis: int | tuple[int, ...] = -1,
    epsilon: float = 1e-6,
    scale_offset: float = 0.0,
    cfg: NormConfig | None = None,
    executor: Any = None,
) -> jax.Array:
    """RMS norm with a tuned config, as flax's `RMSNorm` computes it:
    `x / sqrt(mean(x²) + epsilon) · scale` over `axis` (no mean subtraction). The
    arguments are `layer_norm`'s, less `bias`.

    Example:
      >>> import jax.numpy as jnp
      >>> from kerneltune.kernels import rms_norm
      >>> rms_norm(jnp.full((2, 4), 3.0), jnp.ones(4)).round(3).tolist()
      [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    """
    params = (("scale", scale, 1.0),)
    return _normalize(RMSNorm, rms_norm_xla, x, params, axis, epsilon, scale_offset, cfg, executor)
