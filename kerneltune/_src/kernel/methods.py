"""A kernel class's methods for one platform and calling context, found once.

A kernel names its methods per platform and per context: `run_triton`, `run_xla`,
`heuristic_cfg`, `run_shard_map`, ... `methods_of(kernel, context)` looks every hook up
the first time a (kernel class, platform, context) is seen and keeps the answer in one
frozen record, `KernelMethods`, which selection, tuning, dispatch and the bundled kernels
read. The record holds method *names*, so one record serves every instance of the class;
`bound(kernel, name)` binds one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from kerneltune._src.core import devices
from kerneltune._src.kernel.base import Kernel

#: The hooks a record holds, by field: the names a kernel defines them under (aliases,
#: the first defined one wins).
HOOKS: dict[str, tuple[str, ...]] = {
    "run": ("run",),
    "heuristic_cfg": ("heuristic_cfg",),
    "candidates": ("candidate_cfgs", "config_space"),
    "fwd_with_residuals": ("fwd_with_residuals",),
    "vjp": ("vjp",),
    "custom_vjp": ("custom_vjp",),
    "reference": ("reference",),
    "tuning_inputs": ("tuning_inputs",),
    "config_unusable": ("config_unusable",),
}


@dataclasses.dataclass(frozen=True)
class KernelMethods:
    """The names of a kernel class's methods on one platform in one calling context
    (None where its subclass defines none), and its declared config type.

    Attributes:
      platform: the dispatch backend ("triton", "pallas" or "xla").
      device: the device kind ("gpu", "tpu" or "cpu").
      context: "shard_map" for the per-shard calls of `method="shard_map"`, else None.
      run: runs the kernel with a config.
      heuristic_cfg: the config to use without tuning.
      candidates: `candidate_cfgs` or `config_space`. Found without a context: a shard
        is tuned over the kernel's own candidates.
      fwd_with_residuals: the forward of a custom gradient (with `vjp`).
      vjp: the backward of a custom gradient.
      custom_vjp: the short form of a custom gradient.
      reference: the op's math in plain JAX (outputs are checked, and second
        derivatives taken, against it).
      tuning_inputs: builds inputs to tune on when the call is traced.
      config_unusable: says why a config cannot run here.
      config_type: the class's `config_type` (None: the type `heuristic_cfg` returns).
    """

    platform: str
    device: str
    context: str | None
    run: str | None
    heuristic_cfg: str | None
    candidates: str | None
    fwd_with_residuals: str | None
    vjp: str | None
    custom_vjp: str | None
    reference: str | None
    tuning_inputs: str | None
    config_unusable: str | None
    config_type: type | None


_records: dict[tuple[type, str, str, str | None], KernelMethods] = {}


def methods_of(kernel: Kernel[Any, Any], context: str | None = None) -> KernelMethods:
    """The record of `kernel`'s class on the current platform (`KERNELTUNE_PLATFORM`
    honoured) in `context`; built on first use, then kept."""
    cls = type(kernel)
    platform = devices.get_device_platform()
    device = devices.device_kind()
    key = (cls, platform, device, context)
    found = _records.get(key)
    if found is None:
        found = _records.setdefault(key, _build(cls, platform, device, context))
    return found


def bound(kernel: Kernel[Any, Any], name: str | None) -> Callable[..., Any] | None:
    """`kernel`'s method called `name` (a field of its record), or None."""
    return None if name is None else getattr(kernel, name)


def method_names(hook: str, context: str | None, backend: str, device: str) -> list[str]:
    """Candidate method names for `hook`, most specific first."""
    names = []
    if context:
        names += [f"{hook}_{context}_{backend}", f"{hook}_{context}_{device}", f"{hook}_{context}"]
    names += [f"{hook}_{backend}", f"{hook}_{device}", hook]
    return names


def _build(cls: type, platform: str, device: str, context: str | None) -> KernelMethods:
    def find(field: str) -> str | None:
        # A shard is tuned over the kernel's own candidates: found without a context.
        where = None if field == "candidates" else context
        return _find_method(cls, HOOKS[field], where, platform, device)

    return KernelMethods(
        platform=platform,
        device=device,
        context=context,
        config_type=getattr(cls, "config_type", None),
        **{field: find(field) for field in HOOKS},
    )


def _find_method(
    cls: type, hooks: Sequence[str], context: str | None, backend: str, device: str
) -> str | None:
    """The name of the method for `hooks` that fits the platform, or None when the
    kernel's subclass defines none (never a base-class stub).

    Order: `hook_{context}_{backend}`, `hook_{context}_{device}`, `hook_{context}`,
    `hook_{backend}`, `hook_{device}`, `hook`. Several hook names (e.g.
    `("candidate_cfgs", "config_space")`) are aliases: at each level the first defined
    one wins.
    """
    per_hook = [method_names(h, context, backend, device) for h in hooks]
    for level in zip(*per_hook, strict=True):
        name = next((n for n in level if _defined_by_subclass(cls, n)), None)
        if name is not None:
            return name
    return None


def _defined_by_subclass(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        if klass is Kernel or klass is object:
            return False
        if name in vars(klass):
            return True
    return False
