"""The matmul's second GPU backend: JAX's Mosaic GPU matmul for Hopper.

`jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu` is JAX's own kernel: TMA bulk
copies into swizzled shared memory, a producer warpgroup feeding two compute
warpgroups that run `wgmma`, a persistent grid, and optional two-block clusters that
multicast a shared operand tile. kerneltune calls it as a dependency: this module maps
a `MatmulConfig(backend="mosaic")` onto the module's `TuningConfig`, pads shapes its
tiles do not divide, and checks at run time that the installed JAX has what the
mapping needs, because the module is experimental and its API moves between releases
(`matmul(a, b, config)` in some, `matmul(a, b, c, config)` in others).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from typing import Any

import jax

from kerneltune.kernels._common import device_kind_name, is_hopper, logger, pad_to
from kerneltune.kernels.matmul.config import MatmulConfig
from kerneltune.kernels.matmul.mosaic_space import TUNING_FIELDS, MosaicSupport
from kerneltune.kernels.matmul.pallas_backward import PallasGradient

MODULE = "jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu"


@dataclasses.dataclass(frozen=True)
class MosaicModule:
    """JAX's Hopper matmul module as kerneltune uses it (see `inspect_module`)."""

    support: MosaicSupport
    module: Any = None
    fn: Any = None
    passes_c: bool = False


def support() -> MosaicSupport:
    """Whether this JAX's Hopper Mosaic matmul can run kerneltune's Mosaic configs, and
    if not, why (read once per process; the module is imported on first use)."""
    return _load().support


@functools.cache
def _load() -> MosaicModule:
    try:
        module = importlib.import_module(MODULE)
    except Exception as e:  # an ImportError, or any error inside an experimental module
        loaded = _unsupported(f"`import {MODULE}` failed ({type(e).__name__}: {e})")
    else:
        loaded = inspect_module(module)
    if loaded.support.reason is not None:
        logger.info("the matmul's Mosaic GPU backend is off: %s", loaded.support.reason)
    return loaded


def _unsupported(reason: str) -> MosaicModule:
    return MosaicModule(MosaicSupport(reason=reason, fields=frozenset()))


def inspect_module(module: Any) -> MosaicModule:
    """What kerneltune can use of `module` (JAX's Hopper matmul module, or a stand-in
    in tests): its `matmul` function, whether that takes a `c` operand, and the fields
    of its `TuningConfig`; or why it cannot be used."""
    unsupported = _unsupported
    tuning = getattr(module, "TuningConfig", None)
    if not (isinstance(tuning, type) and dataclasses.is_dataclass(tuning)):
        return unsupported(f"{MODULE} has no TuningConfig dataclass")
    if not isinstance(getattr(module, "MatmulDimension", None), type):
        return unsupported(f"{MODULE} has no MatmulDimension")
    fn = getattr(module, "matmul", None)
    if not callable(fn):
        return unsupported(f"{MODULE} has no `matmul` function")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return unsupported(f"the signature of {MODULE}.matmul cannot be read")
    if "config" not in params:
        return unsupported(f"{MODULE}.matmul takes no `config` (its parameters: {list(params)})")
    extra = [
        name
        for name, param in list(params.items())[2:]
        if name not in ("c", "config")
        and param.default is inspect.Parameter.empty
        and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
    ]
    if extra:
        return unsupported(f"{MODULE}.matmul also requires {extra}, which kerneltune does not pass")
    fields = dataclasses.fields(tuning)
    required = {
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    if required - TUNING_FIELDS:
        return unsupported(
            f"{MODULE}.TuningConfig requires {sorted(required - TUNING_FIELDS)}, which "
            "kerneltune does not set"
        )
    return MosaicModule(
        MosaicSupport(reason=None, fields=frozenset(f.name for f in fields)),
        module=module,
        fn=fn,
        passes_c="c" in params,
    )


def tuning_config(cfg: MatmulConfig, module: Any = None) -> Any:
    """`cfg` as `module`'s `TuningConfig` (default: JAX's Hopper matmul module): its
    tiles are per compute warpgroup, ours per thread block."""
    if module is None:
        module = _require(cfg).module
    dims = module.MatmulDimension

    def dim(name: str | None) -> Any:
        return None if name is None else dims[name.upper()]

    wg_m, wg_n = cfg.warpgroup_tile
    return module.TuningConfig(
        tile_m=wg_m,
        tile_n=wg_n,
        tile_k=cfg.block_k,
        max_concurrent_steps=cfg.max_concurrent_steps,
        epi_tile_m=cfg.epi_tile_m,
        epi_tile_n=cfg.epi_tile_n,
        grid_minor_dim=dim(cfg.grid_minor_dim),
        grid_tile_width=cfg.grid_tile_width,
        wg_dimension=dim(cfg.wg_dimension),
        cluster_dimension=dim(cfg.cluster_dimension),
    )


def _require(cfg: MatmulConfig) -> MosaicModule:
    if cfg.backend != "mosaic":
        raise ValueError(f"the Mosaic matmul takes a backend='mosaic' config, got {cfg!r}.")
    loaded = _load()
    reason = loaded.support.reason
    if reason is None and TUNING_FIELDS - loaded.support.fields:
        reason = f"its TuningConfig has no {sorted(TUNING_FIELDS - loaded.support.fields)}"
    if reason is not None:
        raise RuntimeError(f"MatmulConfig(backend='mosaic') cannot run: {reason}.")
    return loaded


def matmul_mosaic(x: jax.Array, y: jax.Array, cfg: MatmulConfig) -> jax.Array:
    """`x @ y` for 2-D 16-bit `x[m, k]` and `y[k, n]` through JAX's Hopper Mosaic GPU
    matmul with `cfg`'s tiles (float32 accumulation, output in `x`'s dtype).

    Dimensions that a cluster's tile (M, N) or `block_k` (K) does not divide are
    zero-padded: correct, but wasted work (the candidate space avoids such configs).

    Raises:
      RuntimeError: this JAX's Mosaic matmul is missing or incompatible, or the
        device is not a Hopper GPU.
      TypeError: the inputs are not 16-bit floats.
    """
    loaded = _require(cfg)
    if not is_hopper():
        raise RuntimeError(
            "MatmulConfig(backend='mosaic') runs on Hopper GPUs (H100, H200, H800, GH200) "
            f"only; the default device is {device_kind_name()!r}."
        )
    if x.dtype.itemsize != 2 or y.dtype != x.dtype:
        raise TypeError(
            "MatmulConfig(backend='mosaic') takes float16 or bfloat16 x and y of one "
            f"dtype, got {x.dtype} and {y.dtype}."
        )
    m, _ = x.shape
    n = y.shape[1]
    cm, cn = cfg.cluster_tile
    xp = pad_to(x, (cm, cfg.block_k))
    yp = pad_to(y, (cfg.block_k, cn))
    kwargs: dict[str, Any] = {"config": tuning_config(cfg, loaded.module)}
    if loaded.passes_c:
        kwargs["c"] = None  # no `+ c` epilogue
    out = loaded.fn(xp, yp, **kwargs)
    return out if out.shape == (m, n) else out[:m, :n]


class MosaicBackend(PallasGradient):
    """JAX's Mosaic GPU Hopper matmul (16-bit inputs)."""

    name = "mosaic"
    lowering = "mosaic_gpu"

    def run(self, kernel, x, y, *, cfg: MatmulConfig):
        if kernel.use_interpreter():
            raise ValueError(
                f"{kernel.op_id}: MatmulConfig(backend='mosaic') runs on Hopper GPUs, not "
                "in the Pallas interpreter; use a backend='triton' config."
            )
        return matmul_mosaic(x, y, cfg)
