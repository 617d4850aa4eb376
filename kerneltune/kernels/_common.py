"""Helpers shared by the bundled kernels: Pallas version differences, candidate
pruning with reasons, device limits, and dtype-aware tolerances.

Pallas moves fast. Everything here that touches its API looks the names up at call
time and says what it needs when a name is missing, so one module works with the JAX
releases the project supports (0.10 on CI, 0.11 on the GPU machines, newer).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from kerneltune._src.kernel.backends import Pruned as Pruned

logger = logging.getLogger("kerneltune")

T = TypeVar("T")

#: Shared memory one thread block may use on Hopper (H100, H200): 227 KiB.
HOPPER_SMEM_BYTES = 227 * 1024
#: Ampere A100: 163 KiB; other GPUs: a conservative 99 KiB.
_SMEM_BY_KIND = (
    ("h100", HOPPER_SMEM_BYTES),
    ("h200", HOPPER_SMEM_BYTES),
    ("h800", HOPPER_SMEM_BYTES),
    ("gh200", HOPPER_SMEM_BYTES),
    ("a100", 163 * 1024),
    ("a800", 163 * 1024),
)
_DEFAULT_SMEM_BYTES = 99 * 1024
#: 32-bit registers one thread may hold.
MAX_REGISTERS_PER_THREAD = 255


def on_gpu() -> bool:
    """True when JAX's default device is a GPU."""
    return jax.devices()[0].platform.lower() in ("gpu", "cuda", "rocm")


#: Substrings of `device_kind` that name a Hopper GPU (compute capability 9.0).
HOPPER_KINDS = ("h100", "h200", "h800", "gh200")


def device_kind_name() -> str:
    """The default device's `device_kind` (e.g. "NVIDIA H200"), or its platform."""
    device = jax.devices()[0]
    return str(getattr(device, "device_kind", device.platform))


def is_hopper() -> bool:
    """True when JAX's default device is a Hopper GPU (H100, H200, H800, GH200)."""
    return on_gpu() and any(name in device_kind_name().lower() for name in HOPPER_KINDS)


@functools.cache
def shared_memory_limit() -> int:
    """Bytes of shared memory one Triton program (thread block) may use on the default
    device; the Hopper figure off GPUs, so interpreted runs prune like an H100 would."""
    if not on_gpu():
        return HOPPER_SMEM_BYTES
    kind = str(getattr(jax.devices()[0], "device_kind", "")).lower()
    return next((limit for name, limit in _SMEM_BY_KIND if name in kind), _DEFAULT_SMEM_BYTES)


def shared_memory_rule(need: int, limit: int, breakdown: str = "") -> str | None:
    """Why a config that needs `need` bytes of shared memory cannot run where a block
    gets `limit` (None when it fits); `breakdown` says where the bytes go."""
    if need <= limit:
        return None
    where = f" ({breakdown})" if breakdown else ""
    return (
        f"needs {need // 1024} KiB of shared memory{where}, more than the "
        f"{limit // 1024} KiB available"
    )


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def powers_of_2(lo: int, hi: int) -> list[int]:
    """Powers of two from `lo` to `hi` inclusive (both powers of two)."""
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return out


def pad_to(a: jax.Array, multiples: tuple[int, ...]) -> jax.Array:
    """`a` zero-padded at the end of each dimension to a multiple of `multiples` (as
    is when they divide it)."""
    pads = [(0, (-d) % m) for d, m in zip(a.shape, multiples, strict=False)]
    return jax.numpy.pad(a, pads) if any(p for _, p in pads) else a


# --- Pallas across JAX versions ----------------------------------------------------------


def triton_compiler_params(**fields: Any) -> Any:
    """Triton compiler parameters for `pallas_call(compiler_params=...)`.

    The class is `jax.experimental.pallas.triton.CompilerParams` in current JAX and
    was `TritonCompilerParams` (in `pallas.gpu` or `pallas`) before; fields it does
    not know (e.g. `num_stages` where it was dropped) are left out with a debug log.
    """
    cls = _triton_params_class()
    try:
        accepted = set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        accepted = set(fields)
    dropped = sorted(set(fields) - accepted)
    if dropped:
        logger.debug("%s does not take %s; left out", cls.__qualname__, dropped)
    return cls(**{k: v for k, v in fields.items() if k in accepted and v is not None})


def launch_params(cfg: Any, *, interpret: bool) -> Any:
    """`pallas_call`'s `compiler_params` for a config with `num_warps` (and
    `num_stages`, where it has one): None in the interpreter, which takes no Triton
    parameters."""
    if interpret:
        return None
    return triton_compiler_params(
        num_warps=cfg.num_warps, num_stages=getattr(cfg, "num_stages", None)
    )


def triton_ops() -> Any:
    """`jax.experimental.pallas.triton` (masked `load` and `store`), imported when a
    kernel is traced: a JAX without the Pallas Triton lowering still imports kerneltune
    (its Triton candidates are pruned with a reason instead)."""
    from jax.experimental.pallas import triton as plt

    return plt


@functools.cache
def _triton_params_class() -> type:
    tried = []
    for module_name, attr in (
        ("jax.experimental.pallas.triton", "CompilerParams"),
        ("jax.experimental.pallas.triton", "TritonCompilerParams"),
        ("jax.experimental.pallas.gpu", "TritonCompilerParams"),
        ("jax.experimental.pallas", "TritonCompilerParams"),
    ):
        tried.append(f"{module_name}.{attr}")
        try:
            module = __import__(module_name, fromlist=[attr])
        except ImportError:
            continue
        cls = getattr(module, attr, None)
        if isinstance(cls, type):
            return cls
    raise ImportError(
        "this JAX has no Triton compiler-parameter class for Pallas; looked for " + ", ".join(tried)
    )


# --- candidate spaces with reasons ---------------------------------------------------


Rule = Callable[[T], "str | None"]


def prune(
    candidates: Iterable[T], rules: Sequence[Rule[T]], *, what: str
) -> tuple[list[T], list[Pruned[T]]]:
    """Splits `candidates` into those every rule accepts and those some rule rejects.

    A rule returns None to accept a candidate, or the reason to reject it; the first
    rejecting rule's reason is kept. Duplicates are dropped. The pruned candidates are
    logged at DEBUG level, one line each.

    Returns:
      (kept, pruned), both in the order given.
    """
    kept: list[T] = []
    pruned: list[Pruned[T]] = []
    seen: set[Any] = set()
    for cfg in candidates:
        if cfg in seen:
            continue
        seen.add(cfg)
        reason = next((r for r in (rule(cfg) for rule in rules) if r is not None), None)
        if reason is None:
            kept.append(cfg)
        else:
            pruned.append(Pruned(cfg, reason))
    if pruned:
        logger.debug("%s: %d candidates kept, %d pruned", what, len(kept), len(pruned))
        for p in pruned:
            logger.debug("  pruned %s: %s", p.cfg, p.reason)
    return kept, pruned


# --- tolerances ---------------------------------------------------------------------


def tolerance(dtype: Any) -> float:
    """A relative-error bound ‖out − ref‖ / ‖ref‖ for a kernel computed in `dtype`
    against a float32/float64 reference: the dtype's rounding, with room for
    accumulation order and (for float32 on GPUs) TF32 matrix units."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return 1e-10
    if dtype == np.float32:
        return 2e-3 if on_gpu() else 1e-5
    if dtype.itemsize == 2:  # bfloat16 and float16
        return 2e-2 if dtype.name == "bfloat16" else 5e-3
    return 5e-2


def relative_error(out: Any, ref: Any) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN anywhere gives inf)."""
    a = np.asarray(jax.device_get(out), dtype=np.float64)
    b = np.asarray(jax.device_get(ref), dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if not np.all(np.isfinite(a)):
        return float("inf")
    denom = float(np.linalg.norm(b)) or 1.0
    return float(np.linalg.norm(a - b)) / denom


class WithItemsize:
    """`itemsize` for a problem dataclass with a `dtype` field."""

    dtype: np.dtype

    @property
    def itemsize(self) -> int:
        """The bytes of one element."""
        return np.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class RowsProblem:
    """A row-wise op's problem (softmax, the norms): `rows` rows of `n` elements."""

    rows: int
    n: int
    dtype: np.dtype

    @classmethod
    def of(cls, x: Any) -> RowsProblem:
        """The problem of an array reduced over its last axis."""
        rows = int(np.prod(x.shape[:-1], dtype=np.int64))
        return cls(rows=rows, n=int(x.shape[-1]), dtype=np.dtype(x.dtype))


# --- kernels bound to an executor ------------------------------------------------------


_bound: dict[tuple[type, int | None, bool], Any] = {}


def kernel_for(cls: type[T], executor: Any, *, interpret: bool = False) -> T:
    """The instance of kernel class `cls` bound to `executor` (one per pair, so the
    executor's per-kernel program caches keep working across calls); with `interpret`,
    the one that runs its Pallas code in the interpreter."""
    key = (cls, getattr(executor, "uid", None) if executor is not None else None, interpret)
    found = _bound.get(key)
    if found is None or found.executor is not executor:
        found = cls(executor=executor, interpret=interpret)  # type: ignore[call-arg]
        _bound[key] = found
    return found


def interpreted(cls: type[T]) -> Callable[..., T]:
    """`cls` run by the Pallas interpreter: `interpreted(Softmax)(executor=ex)` is
    `Softmax(executor=ex, interpret=True)`, op id `"softmax-interpret"`. The kernels'
    `...Interpret` names are these (for tests and the CPU demo)."""

    def make(op_id: str | None = None, *, executor: Any = None, **kwargs: Any) -> T:
        return cls(op_id, executor=executor, interpret=True, **kwargs)  # type: ignore[call-arg]

    make.__name__ = make.__qualname__ = f"{cls.__name__}Interpret"
    make.__doc__ = f"`{cls.__name__}` run by the Pallas interpreter on any device."
    return make


def pallas_dot(
    x: jax.Array, y: jax.Array, *, upcast: bool, trans_x: bool = False, trans_y: bool = False
) -> jax.Array:
    """`x · y` (either transposed) inside a Pallas kernel, accumulated in float32; with
    `upcast` (the interpreter on CPUs: XLA:CPU has no bf16 × bf16 → f32 dot) the
    operands are cast to float32 first."""
    if upcast:
        x, y = x.astype(jnp.float32), y.astype(jnp.float32)
    if trans_x:
        x = x.T
    if trans_y:
        y = y.T
    return jnp.dot(x, y, preferred_element_type=jnp.float32)


def jax_gpu_op(name: str) -> Any:
    """The module `jax.experimental.pallas.ops.gpu.<name>`: JAX's Mosaic GPU kernels
    that the grouped matmul wraps (JAX 0.12.1 removed the Triton ones; kerneltune's
    softmax, norms and attention have kernels of their own). A deprecation warning
    from such a module would only point users at kerneltune's internals."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(f"jax.experimental.pallas.ops.gpu.{name}")
