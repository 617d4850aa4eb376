"""tokamax's gated linear unit as an optional backend.

tokamax is not a dependency: where it is installed (found without importing it, which
is slow and would touch JAX), `tokamax.gated_linear_unit` joins the GPU candidates so a
tuned call is never slower than what a tokamax user already has. JAX differentiates it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from kerneltune._src.kernel.backends import Backend
from kerneltune.kernels._common import on_gpu


@functools.cache
def installed() -> bool:
    """Whether `tokamax` can be found (found only: importing waits for a call)."""
    return importlib.util.find_spec("tokamax") is not None


def unsupported() -> str | None:
    """Why tokamax's gated linear unit cannot run here, or None when it can."""
    if not installed():
        return "tokamax is not installed (pip install tokamax)"
    if not on_gpu():
        return "tokamax's fused gated linear unit is a GPU kernel"
    return None


def gated_linear_unit(x: Any, w: Any, activation: Callable[[Any], Any]) -> Any:
    """`activation(x·W₀) ⊙ (x·W₁)` by tokamax (fused `[K, 2, N]` weights)."""
    tokamax = importlib.import_module("tokamax")
    fused = jnp.stack(w, axis=1) if isinstance(w, (tuple, list)) else w
    return tokamax.gated_linear_unit(x, fused, activation=activation)


class TokamaxBackend(Backend):
    """tokamax's `gated_linear_unit` where installed; it brings its own VJP, which JAX
    differentiates."""

    name = "tokamax"
    differentiated_by_jax = True

    def unusable(self, kernel, inv, cfg) -> str | None:
        return unsupported()

    def run(self, kernel, x, w, *, cfg, activation):
        return gated_linear_unit(x, w, activation)
