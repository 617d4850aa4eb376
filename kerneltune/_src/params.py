"""Standard parameter containers for attention-like kernels (the seeds' FwdParams and
BwdParams): frozen, hashable, validated, and round-trip through JSON."""

from __future__ import annotations

import dataclasses
from typing import ClassVar


def check_positive_power_of_two(owner: str, name: str, value: int | None) -> None:
    """Raises ValueError unless `value` is None or a positive power of two."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise ValueError(f"{owner}.{name} must be a positive power of two, got {value!r}.")


def check_one_of(owner: str, name: str, value: object, allowed: tuple[object, ...]) -> None:
    """Raises ValueError unless `value` is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{owner}.{name} must be one of {allowed}, got {value!r}.")


def check_positive(owner: str, name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}.")


#: The implementations a `FwdParams` can choose.
FWD_BACKENDS = ("pallas", "cudnn", "xla", "tokamax")


@dataclasses.dataclass(frozen=True)
class _BlockParams:
    """The launch parameters both passes share; `None` lets the kernel choose. Each
    pass declares its `backend` field and the implementations it may name."""

    backends: ClassVar[tuple[str, ...]] = ()

    q_blocksize: int | None = None
    kv_blocksize: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_one_of(owner, "backend", getattr(self, "backend"), self.backends)  # noqa: B009
        check_positive_power_of_two(owner, "q_blocksize", self.q_blocksize)
        check_positive_power_of_two(owner, "kv_blocksize", self.kv_blocksize)
        check_positive_power_of_two(owner, "num_warps", self.num_warps)
        check_positive(owner, "num_stages", self.num_stages)


@dataclasses.dataclass(frozen=True)
class FwdParams(_BlockParams):
    """Forward-pass launch parameters; `None` lets the kernel choose.

    Example:
      >>> import kerneltune
      >>> p = kerneltune.FwdParams(q_blocksize=128, kv_blocksize=64, num_warps=4)
      >>> kerneltune.from_json(kerneltune.to_json(p), kerneltune.FwdParams) == p
      True
    """

    #: Which implementation runs: "pallas" (the block sizes above apply), "cudnn"
    #: (`jax.nn.dot_product_attention(implementation="cudnn")`), "xla", or "tokamax"
    #: (tokamax's Mosaic GPU kernel, where tokamax is installed).
    backend: str = "pallas"
    backends: ClassVar[tuple[str, ...]] = FWD_BACKENDS


#: The implementations a `BwdParams` can choose.
BWD_BACKENDS = ("pallas", "xla")


@dataclasses.dataclass(frozen=True)
class BwdParams(_BlockParams):
    """Backward-pass launch parameters; `None` lets the kernel choose."""

    #: "pallas" (kerneltune's Pallas flash backward; the block sizes above apply) or "xla"
    #: (the backward in XLA from the saved log-sum-exp, for lengths the fused kernel
    #: cannot split alike).
    backend: str = "pallas"
    backends: ClassVar[tuple[str, ...]] = BWD_BACKENDS
