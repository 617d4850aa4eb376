"""A kernel's hooks for one platform and calling context, found once.

`methods_of(kernel, context)` returns the kernel's `contract.KernelMethods` record,
built the first time a (kernel class, platform, device, context) is seen:

- a bundled kernel (`backends.BackendKernel`) names its hooks itself
  (`BackendKernel.contract_methods`): one method per hook, which asks the config's
  backend object;
- any other kernel follows SPEC's naming convention, and the most specific method its
  subclass defines is taken: `hook_{context}_{platform}`, `hook_{context}_{device}`,
  `hook_{context}`, `hook_{platform}`, `hook_{device}`, `hook` (e.g. `run_triton` on a
  GPU, `run` elsewhere).

`bound(kernel, hook)` binds one of the record's functions to an instance.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from kerneltune._src.core import devices
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import Kernel
from kerneltune._src.kernel.contract import HOOKS, KernelMethods

#: The method names a user's kernel may define each hook under (aliases: the first one
#: defined wins), before the platform and context suffixes.
NAMED_HOOKS: dict[str, tuple[str, ...]] = {
    "run": ("run",),
    "heuristic_cfg": ("heuristic_cfg",),
    "candidates": ("candidate_cfgs", "config_space"),
    "fwd_with_residuals": ("fwd_with_residuals",),
    "vjp": ("vjp",),
    "custom_vjp": ("custom_vjp",),
    "differentiated_by_jax": ("differentiated_by_jax",),
    "reference": ("reference",),
    "tuning_inputs": ("tuning_inputs",),
    "config_unusable": ("config_unusable",),
}
assert tuple(NAMED_HOOKS) == HOOKS

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
        if isinstance(kernel, BackendKernel):
            built = kernel.contract_methods(platform, device, context)
        else:
            built = _named(cls, platform, device, context)
        found = _records.setdefault(key, built)
    return found


def bound(kernel: Kernel[Any, Any], hook: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """`hook` (a function of the kernel's record) bound to `kernel`, or None."""
    if hook is None:
        return None
    get = getattr(hook, "__get__", None)
    return hook if get is None else get(kernel, type(kernel))  # type: ignore[no-any-return]


# --- SPEC's naming convention, for kernels that declare no backends ------------------


def method_names(hook: str, context: str | None, platform: str, device: str) -> list[str]:
    """Candidate method names for `hook`, most specific first."""
    names = []
    if context:
        names += [f"{hook}_{context}_{platform}", f"{hook}_{context}_{device}", f"{hook}_{context}"]
    names += [f"{hook}_{platform}", f"{hook}_{device}", hook]
    return names


def _named(cls: type, platform: str, device: str, context: str | None) -> KernelMethods:
    def find(field: str) -> Callable[..., Any] | None:
        name = _find_method(cls, NAMED_HOOKS[field], context, platform, device)
        return None if name is None else inspect.getattr_static(cls, name)

    return KernelMethods(
        platform=platform,
        device=device,
        context=context,
        config_type=getattr(cls, "config_type", None),
        **{field: find(field) for field in HOOKS},
    )


def _find_method(
    cls: type, hooks: Sequence[str], context: str | None, platform: str, device: str
) -> str | None:
    """The name of the method for `hooks` that fits the platform, or None when the
    kernel's subclass defines none (never a base-class stub). At each level of
    `method_names` the first defined alias wins."""
    per_hook = [method_names(h, context, platform, device) for h in hooks]
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
