"""The calls `kerneltune demo` makes: the bundled kernels on realistic shapes on a GPU,
and on tiny shapes in the Pallas interpreter elsewhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Args = tuple[tuple[Any, ...], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class DemoJob:
    """One demo call: a kernel on one shape (with its backward when `grad`)."""

    op: str
    kernel_type: type
    shape: str
    dtype: str
    make_args: Callable[[jax.Array], Args]
    grad: bool = False
    #: Run the kernel's Pallas code in the Pallas interpreter (the CPU demo).
    interpret: bool = False

    def kernel(self, executor: Any = None) -> Any:
        """The job's kernel, bound to `executor`."""
        return self.kernel_type(executor=executor, interpret=self.interpret)


def _normal(key: jax.Array, shape: tuple[int, ...], dtype: Any, scale: float = 1.0) -> jax.Array:
    return (scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def jobs_for(on_gpu: bool) -> list[DemoJob]:
    """Two shapes per bundled kernel: realistic ones for the Pallas kernels on a GPU,
    tiny ones for the interpreted Pallas kernels on a CPU."""
    from kerneltune import kernels
    from kerneltune.kernels.attention import shapes as attention_shapes
    from kerneltune.kernels.matmul import shapes as matmul_shapes
    from kerneltune.kernels.normalization import shapes as norm_shapes
    from kerneltune.kernels.softmax import shapes as softmax_shapes

    dtype = jnp.bfloat16 if on_gpu else jnp.float32
    dname = jnp.dtype(dtype).name
    pick = (lambda m: m.DEMO_SHAPES_GPU) if on_gpu else (lambda m: m.DEMO_SHAPES_CPU)
    interpret = not on_gpu
    mm, att, ln, rms = kernels.Matmul, kernels.Attention, kernels.LayerNorm, kernels.RMSNorm
    sm = kernels.Softmax
    out: list[DemoJob] = []
    for m, k, n in pick(matmul_shapes):

        def mk(key, m=m, k=k, n=n):
            a, b = jax.random.split(key)
            return (_normal(a, (m, k), dtype), _normal(b, (k, n), dtype)), {}

        out.append(DemoJob("matmul", mm, f"{m}x{k}x{n}", dname, mk, interpret=interpret))
    for b, t, h, d, causal in pick(attention_shapes):

        def ma(key, b=b, t=t, h=h, d=d, causal=causal):
            q, k, v = jax.random.split(key, 3)
            return tuple(_normal(x, (b, t, h, d), dtype) for x in (q, k, v)), {"causal": causal}

        out.append(
            DemoJob(
                "attention",
                att,
                f"{b}x{t}x{h}x{d}{' causal' if causal else ''}",
                dname,
                ma,
                grad=True,
                interpret=interpret,
            )
        )
    for rows, n in pick(norm_shapes):

        def mln(key, rows=rows, n=n):
            a, b, c = jax.random.split(key, 3)
            return (
                _normal(a, (rows, n), dtype),
                _normal(b, (n,), dtype, 0.1) + 1,
                _normal(c, (n,), dtype, 0.1),
            ), {}

        def mrms(key, rows=rows, n=n):
            a, b = jax.random.split(key)
            return (_normal(a, (rows, n), dtype), _normal(b, (n,), dtype, 0.1) + 1), {}

        out.append(DemoJob("layer_norm", ln, f"{rows}x{n}", dname, mln, interpret=interpret))
        out.append(DemoJob("rms_norm", rms, f"{rows}x{n}", dname, mrms, interpret=interpret))
    for rows, n in pick(softmax_shapes):

        def ms(key, rows=rows, n=n):
            return (_normal(key, (rows, n), dtype),), {}

        out.append(DemoJob("softmax", sm, f"{rows}x{n}", dname, ms, interpret=interpret))
    return out
