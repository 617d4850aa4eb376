"""The configs a lowered program's kerneltune calls would run with, read from the
caches (`labels_to_configs`): what a ported test or a report asks of a compiled step."""

from __future__ import annotations

from typing import Any

from kerneltune._src.core import devices, labels
from kerneltune._src.execution.default import selector_of
from kerneltune._src.kernel.backends import served_op_ids
from kerneltune._src.kernel.base import registered_kernels


def labels_to_configs(lowered: Any, selector: Any = None) -> dict[tuple[str, str], Any]:
    """`{(op_id_v, call_key): cfg}` for the kernel calls in `lowered` whose config the
    selector's caches (memory, then persistent) hold; the default executor's selector
    when `selector` is None. Calls with no cached config are left out.

    Args:
      lowered: a lowered computation (`jax.jit(f).lower(...)`), its `.compile()`, an
        HLO text, or the labels `find_labels_in_lowered` returned (the overview's
        `labels_to_configs(labels)`); labels of other kinds (`label("name")`) are
        ignored.
      selector: the `ConfigSelectorChain` (or `Executor`) whose caches to read.

    Raises:
      TypeError: `lowered` is none of these.
    """
    selector = selector_of(selector)
    dev = devices.device_fingerprint()
    found: dict[tuple[str, str], Any] = {}
    for lab in _kernel_labels(lowered):
        cfg = selector.cache.get(dev, lab.op_id_v, lab.call_key)
        if cfg is None and getattr(selector, "persistent", None) is not None:
            # Typed by the kernel's config class when one is defined here, so an entry
            # that no longer fits it is skipped (with a warning), never returned.
            cfg = selector.persistent.get(
                dev, lab.op_id_v, lab.call_key, cfg_type=_config_type_of(lab.op_id_v)
            )
        if cfg is not None:
            found[(lab.op_id_v, lab.call_key)] = cfg
    return found


def _kernel_labels(lowered: Any) -> list[labels.Label]:
    if not isinstance(lowered, (list, tuple, set, frozenset)):
        return labels.kernel_labels_in_lowered(lowered)
    parsed = []
    for text in lowered:
        if not isinstance(text, str):
            raise TypeError(
                "labels_to_configs(lowered=...) takes a lowered computation or the label "
                f"strings find_labels_in_lowered returns; found {text!r:.60} "
                f"({type(text).__qualname__}) among them."
            )
        label = labels.parse_label(text)
        if label is not None:
            parsed.append(label)
    return parsed


def _config_type_of(op_id_v: str) -> type | None:
    """The config class of the kernel defined in this process with this op id and
    version, or None when there is none (or several disagree)."""
    op_id, _, version = op_id_v.rpartition("@v")
    types = {
        cls.config_type
        for cls in registered_kernels().values()
        if op_id in served_op_ids(cls)
        and str(cls.version) == version
        and cls.config_type is not None
    }
    return types.pop() if len(types) == 1 else None
