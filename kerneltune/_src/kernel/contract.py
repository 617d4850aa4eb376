"""The Kernel contract: every hook a kernel may define, in one place.

A kernel is a class; selection, tuning, recording and dispatch call these hooks and
nothing else. `KernelMethods` is the record of one kernel's hooks in one calling
context: selection and dispatch read it (`methods.methods_of`), so what a hook means is
written here once.

Two ways to fill the record:

- A bundled kernel (`backends.BackendKernel`) declares its backends as objects and
  defines each hook once; `BackendKernel.contract_methods` names them explicitly, so a
  reader follows a call from the executor to the backend that runs it.
- A user's kernel may follow SPEC's naming convention instead: `run_triton`,
  `heuristic_cfg_gpu`, `run_shard_map`, ... (`methods.methods_of` finds the most
  specific one the subclass defines).

| hook | signature | needed | what it does |
| --- | --- | --- | --- |
| `run` | `run(*args, cfg, **kwargs) -> out` | yes | runs the op with a config |
| `prepare` | `prepare(*args, **kwargs) -> (args, kwargs)` | no | checks and normalises the arguments before selection (on `Kernel`) |
| `heuristic_cfg` | `heuristic_cfg(inv) -> cfg` | no | the config without tuning |
| `candidate_cfgs` / `config_space` | `(inv) -> Iterable[cfg]` | no | the configs to tune over |
| `fwd_with_residuals` + `vjp` | `(*args, cfg, **kw) -> (out, res)`; `(res, out, dout, *args, cfg, **kw) -> cotangents` | no | a custom gradient |
| `custom_vjp` | `(primals, cfg, kwargs, cotangents) -> cotangents` | no | the short form of a custom gradient |
| `differentiated_by_jax` | `(cfg) -> bool` | no | True: JAX differentiates `run` with this config (no custom gradient) |
| `reference` | `reference(*args, **kwargs) -> out` | no | the op's math in plain JAX (outputs checked, second derivatives taken, against it) |
| `tuning_inputs` | `(inv) -> (args, kwargs)` | no | inputs to tune on when the call is traced (on `Kernel`) |
| `config_unusable` | `(inv, cfg) -> str or None` | no | why a config cannot run here (a missing library, a lowering this JAX lacks) |
| `pruned_cfgs` | `(inv) -> list[Pruned]` | no | the configs left out of the search, each with its reason (for `explain`) |
| `manifest_kwargs` | `() -> Mapping` | no | the constructor arguments another process rebuilds the kernel with |
| `config_type` | class attribute | no | the config class (default: the type `heuristic_cfg` returns, else the one type of the candidates) |
| `key_builder`, `version`, `op_id`, `tunes_training_apart` | class attributes | no | the cache key's parts (on `Kernel`) |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

#: The hooks a record holds (its fields after `platform`, `device` and `context`).
HOOKS = (
    "run",
    "heuristic_cfg",
    "candidates",
    "fwd_with_residuals",
    "vjp",
    "custom_vjp",
    "differentiated_by_jax",
    "reference",
    "tuning_inputs",
    "config_unusable",
)


@dataclasses.dataclass(frozen=True)
class KernelMethods:
    """A kernel class's hooks in one calling context: plain functions of the class
    (bind one with `methods.bound`), None where the kernel defines none.

    Attributes:
      platform: the dispatch platform ("triton", "pallas" or "xla") it was found for.
      device: the device kind ("gpu", "tpu" or "cpu").
      context: "shard_map" for the per-shard calls of `method="shard_map"`, else None.
      run, heuristic_cfg, candidates, fwd_with_residuals, vjp, custom_vjp,
      differentiated_by_jax, reference, tuning_inputs, config_unusable: the hooks of the
        table above (`candidates` is `candidate_cfgs` or `config_space`).
      config_type: the class's `config_type` (None: the type `heuristic_cfg` returns).
    """

    platform: str
    device: str
    context: str | None
    run: Callable[..., Any] | None
    heuristic_cfg: Callable[..., Any] | None
    candidates: Callable[..., Any] | None
    fwd_with_residuals: Callable[..., Any] | None
    vjp: Callable[..., Any] | None
    custom_vjp: Callable[..., Any] | None
    differentiated_by_jax: Callable[..., Any] | None
    reference: Callable[..., Any] | None
    tuning_inputs: Callable[..., Any] | None
    config_unusable: Callable[..., Any] | None
    config_type: type | None
