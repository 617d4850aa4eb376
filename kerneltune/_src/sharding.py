"""Running a kernel per shard with `shard_map`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from kerneltune._src import dispatch
from kerneltune._src.kernel import Invocation, Kernel


def shard_map_function(kernel: Kernel[Any, Any], cfg: Any, inv: Invocation[Any, Any]) -> Callable[..., Any]:
    """`f(*args, **kwargs)` running the kernel on each shard (its `run_shard_map*`
    method when it defines one, else `run`), with `cfg` chosen for the shard shapes."""
    per_shard = dispatch.kernel_function(kernel, cfg, context="shard_map")

    def call(*args: Any, **kwargs: Any) -> Any:
        def body(*shards: Any) -> Any:
            return per_shard(*shards, **kwargs)

        return jax.shard_map(body, mesh=inv.mesh, in_specs=inv.in_specs, out_specs=inv.out_specs)(*args)

    return call
