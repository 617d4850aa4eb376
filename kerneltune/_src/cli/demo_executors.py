"""The executors behind the demo's two kerneltune columns, and the one that runs the
bundled kernels' Pallas code in the Pallas interpreter on a CPU.

- *untuned*: each kernel's heuristic config; nothing tuned, read or stored.
- *chosen*: what the default executor does (`default.py`): the policy of the
  `KERNELTUNE_*` options (a first call tuned within a budget), the tables shipped for
  this GPU and a persistent cache, the demo's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kerneltune._src.caching.cache import ConfigCache
from kerneltune._src.caching.shipped import package_tables
from kerneltune._src.core import options
from kerneltune._src.execution.executor import Executor
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.selection.chain import AutotunePolicy, ConfigSelectorChain
from kerneltune._src.tuning.tuner import Tuner
from kerneltune.kernels._common import kernel_for


class InterpretingExecutor(Executor[Any, Any]):
    """An executor that runs every bundled kernel with Pallas code as its interpreted
    twin (`interpret=True`, op id `"<op>-interpret"`), so the ops' public functions,
    called with `executor=`, tune and run their Pallas kernels on a CPU. A kernel with
    no interpretable backend runs as it is."""

    def __call__(self, kernel: Any, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(self.kernel_that_runs(kernel), *args, **kwargs)

    def call_traced(
        self, kernel: Any, *args: Any, own: Callable[[Any], Callable[[], Any] | None], **kwargs: Any
    ) -> Any:
        return super().call_traced(self.kernel_that_runs(kernel), *args, own=own, **kwargs)

    def kernel_that_runs(self, kernel: Any) -> Any:
        if not isinstance(kernel, BackendKernel) or kernel.interpret:
            return kernel
        if not any(b.lowering is not None and b.interprets for b in type(kernel).backends):
            return kernel
        return kernel_for(type(kernel), self, interpret=True)


def _executor(chain: ConfigSelectorChain[Any, Any], interpret: bool) -> Executor[Any, Any]:
    return InterpretingExecutor(chain) if interpret else Executor(chain)


def untuned(*, interpret: bool) -> Executor[Any, Any]:
    """Each kernel's heuristic config: no tuning, no cache beyond this process's."""
    policy = AutotunePolicy(allow_autotune=False, cache_miss_fallback="heuristics")
    return _executor(ConfigSelectorChain(ConfigCache(), policy=policy, persistent=None), interpret)


def chosen(
    persistent: Any,
    on_event: Callable[..., None],
    *,
    interpret: bool,
    policy: AutotunePolicy | None = None,
) -> Executor[Any, Any]:
    """The default executor's selection over `persistent`: the policy the options ask
    for (`KERNELTUNE_AUTOTUNE`, the first-call budget) unless `policy` is given, the
    shipped tables unless `KERNELTUNE_SHIPPED=0`; `on_event` sees every choice."""
    chain: ConfigSelectorChain[Any, Any] = ConfigSelectorChain(
        ConfigCache(),
        policy=policy if policy is not None else AutotunePolicy.from_env(),
        tuner=Tuner(progress=False),
        persistent=persistent,
        shipped=package_tables() if options.SHIPPED.value else None,
        on_event=on_event,
    )
    return _executor(chain, interpret)
