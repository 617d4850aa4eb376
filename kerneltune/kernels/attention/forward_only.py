"""A function that runs one program where nothing differentiates it, and another's
values and gradients where something does.

tokamax's attention kernel skips the blocks outside a key range per query in its
forward pass (packed documents then cost their own work: 2-4x faster), but its backward
given those ranges took 1.6-1.7x its backward given the same mask without them (H200,
BENCHMARKS.md, 2026-11-27). So a call that is only evaluated takes the ranges, and a
call under `jax.grad` runs the mask alone, forward and backward, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


def forward_only(fast: Callable[..., Any], full: Callable[..., Any]) -> Callable[..., Any]:
    """`fast(*args)` when the call is only evaluated; under differentiation, `full`'s
    forward and backward (its values must equal `fast`'s). Forward-mode
    differentiation (`jax.jvp`) is not defined, as for any `jax.custom_vjp`."""

    @jax.custom_vjp
    def call(*args: Any) -> Any:
        return fast(*args)

    def forward(*args: Any) -> tuple[Any, Any]:
        return jax.vjp(full, *args)  # the output, and the backward as the residuals

    def backward(back: Any, cotangent: Any) -> Any:
        return back(cotangent)

    call.defvjp(forward, backward)
    return call
