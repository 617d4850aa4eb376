"""Calls keyed on flattened operands that run XLA's choice on the caller's arrays.

The bundled ops flatten leading dimensions (`[B, T, D]` to `[B·T, D]`) before calling
their kernel, so every batch shape with the same rows shares one key, one tuned config
and one shipped entry. But where the chosen config is plain XLA, the flattened program
is not the one plain JAX compiles: XLA lays the weight gradients out differently around
the reshapes (a GPT block's training step ran at 0.98× plain JAX's on an H100). Under a
trace, such a call keeps its 2-D key and runs the XLA code on the unflattened arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kerneltune._src.core import tracing


def call_flattened(
    ex: Any,
    kernel: Any,
    *args: Any,
    cfg: Any,
    flattened: bool,
    unflattened: Mapping[str, Callable[[], Any]],
    **kwargs: Any,
) -> Any:
    """`ex(kernel, *args, cfg=cfg, **kwargs)`, where `args` are the caller's arrays
    flattened to rows; when `flattened` (the caller's arrays were not already 2-D),
    under a trace, with no explicit `cfg`, and the chosen config's backend is one of
    `unflattened`'s (the op's plain-XLA backends), the call's result is that backend's
    `unflattened[backend]()` instead (its output in the caller's shape; the flattened
    call's output has the rows' shape, so callers reshape both)."""
    if flattened and cfg is None and tracing.is_tracing(args) and hasattr(ex, "call_traced"):

        def own(chosen: Any) -> Callable[[], Any] | None:
            return unflattened.get(getattr(chosen, "backend", None))  # type: ignore[arg-type]

        return ex.call_traced(kernel, *args, own=own, **kwargs)
    return ex(kernel, *args, cfg=cfg, **kwargs)
