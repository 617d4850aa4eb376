"""The gated linear unit's config, its heuristic and its candidate space.

Backends: "xla" (the two projections as one `dot_general` over the fused weights, the
activation and product fused by XLA: plain JAX's program), "xla_split" (the other
program plain JAX users write for fused weights: two dots, one over each half; XLA
runs a pair of weights so under "xla" already), "triton" (our Pallas kernel:
both projections accumulate over one pass of `x` tiles and the activation and product
run in its epilogue, so the `[M, 2N]` projections never reach memory) and "tokamax"
(`tokamax.gated_linear_unit`, where tokamax is installed).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np

from kerneltune.kernels._common import MAX_REGISTERS_PER_THREAD, Pruned, WithItemsize, prune
from kerneltune.kernels._config import OLD_BLOCK_NAMES, BackendConfig
from kerneltune.kernels._tiles import MIN_BLOCK as MIN_BLOCK
from kerneltune.kernels._tiles import (
    block_for,
    check_blocks,
    check_launch,
    dot_rules,
    staged_dot_bytes,
)

BACKENDS = ("xla", "xla_split", "triton", "tokamax")
Backend = Literal["xla", "xla_split", "triton", "tokamax"]
#: The backends that are plain JAX code (run on the caller's unflattened arrays).
XLA_BACKENDS = ("xla", "xla_split")
_TRITON_DEFAULTS: dict[str, Any] = {
    "block_m": 64,
    "block_n": 64,
    "block_k": 32,
    "num_warps": 4,
    "num_stages": 3,
}


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class GLUConfig(BackendConfig):
    """How `gated_linear_unit` runs.

    Attributes:
      backend: "xla", "xla_split", "triton" or "tokamax" (see the module docstring).
      block_m, block_n: ("triton") the output tile one program computes; it accumulates two
        `block_m × block_n` float32 tiles (the gate and the up projection).
      block_k: ("triton") shared-dimension step of the inner loop.
      num_warps, num_stages: ("triton") warps per program, pipelining depth.

    Example:
      >>> GLUConfig(backend="triton", block_m=128)
      GLUConfig(backend='triton', block_m=128, block_n=64, block_k=32, num_warps=4, num_stages=3)
      >>> GLUConfig(block_m=64)
      Traceback (most recent call last):
      ...
      ValueError: GLUConfig.block_m is a field of backend='triton'; leave it None with backend='xla' (got 64).
    """

    backend: Backend = "xla"
    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    renamed_fields: ClassVar[Mapping[str, str]] = OLD_BLOCK_NAMES
    backend_fields: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "xla": {},
        "xla_split": {},
        "triton": _TRITON_DEFAULTS,
        "tokamax": {},
    }

    def check(self) -> None:
        if self.backend == "triton":
            check_blocks(self, ("block_m", "block_n", "block_k"))
            check_launch(self)


@dataclasses.dataclass(frozen=True)
class GLUProblem(WithItemsize):
    """`x[m, k]` times two `[k, n]` projections, in `dtype`."""

    m: int
    k: int
    n: int
    dtype: np.dtype


XLA = GLUConfig(backend="xla")
XLA_SPLIT = GLUConfig(backend="xla_split")
TOKAMAX = GLUConfig(backend="tokamax")


def heuristic(p: GLUProblem) -> GLUConfig:
    """XLA: cuBLAS for the projections and XLA's fusion for the epilogue is plain
    JAX's own program (on an H100 within 5% of tokamax's fused kernel forward and
    faster forward + backward), so an untuned call never loses to plain JAX."""
    return XLA


def triton_heuristic(p: GLUProblem) -> GLUConfig:
    """A fused-kernel config that fits any shape: the default tiles, shrunk to a small
    problem."""
    default = _TRITON_DEFAULTS
    return GLUConfig(
        backend="triton",
        block_m=block_for(p.m, default["block_m"]),
        block_n=block_for(p.n, default["block_n"]),
        block_k=block_for(p.k, default["block_k"]),
    )


def shared_memory_bytes(p: GLUProblem, c: GLUConfig) -> int:
    """Per stage: one `x` tile and two weight tiles (gate and up)."""
    assert c.block_m and c.block_n and c.block_k and c.num_stages
    return staged_dot_bytes(c, p.itemsize, weights=2)


def rules(p: GLUProblem, smem_limit: int | None = None):
    def fits_registers(c: GLUConfig) -> str | None:
        assert c.block_m and c.block_n and c.num_warps
        regs = 2 * c.block_m * c.block_n // (32 * c.num_warps)
        if regs > MAX_REGISTERS_PER_THREAD:
            return (
                f"the two {c.block_m}×{c.block_n} float32 accumulators need {regs} registers per "
                f"thread with {c.num_warps} warps (at most {MAX_REGISTERS_PER_THREAD}): they would spill"
            )
        return None

    # Two weight tiles a stage and two accumulators: the gate and the up projection.
    return [*dot_rules(p, smem_limit, weights=2), fits_registers]


def triton_candidates(
    p: GLUProblem, smem_limit: int | None = None
) -> tuple[list[GLUConfig], list[Pruned[GLUConfig]]]:
    """Fused-kernel candidates that fit `p`, and the pruned ones with their reasons.

    Example:
      >>> import numpy as np
      >>> kept, pruned = triton_candidates(GLUProblem(16384, 2048, 5632, np.dtype("bfloat16")))
      >>> len(kept) > 10, any("shared memory" in x.reason for x in pruned)
      (True, True)
    """
    space = [
        GLUConfig(
            backend="triton",
            block_m=block_m,
            block_n=block_n,
            block_k=block_k,
            num_warps=w,
            num_stages=s,
        )
        for block_m, block_n, block_k, w, s in itertools.product(
            (64, 128), (64, 128, 256), (32, 64), (4, 8), (2, 3, 4)
        )
    ]
    return prune(space, rules(p, smem_limit), what=f"gated_linear_unit {p.m}x{p.k}x{p.n}")


def interpret_candidates(p: GLUProblem) -> list[GLUConfig]:
    """XLA and two small fused-kernel tiles, for the Pallas interpreter."""
    out = [XLA, triton_heuristic(p)]
    small = GLUConfig(
        backend="triton", block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2
    )
    if small not in out:
        out.append(small)
    return out
