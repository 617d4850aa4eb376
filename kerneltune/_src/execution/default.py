"""The default executor: the one `kernel(...)`, the bundled ops and every API that
takes `executor=None` use.

It lives above the executor and selection modules (it builds one from the other) and
installs itself as the hook `Kernel.__call__` uses, the way a backend registers into a
core that cannot import it.
"""

from __future__ import annotations

import threading
from typing import Any

from kerneltune._src.caching.cache import ConfigCache
from kerneltune._src.caching.default_cache import default_persistent_cache
from kerneltune._src.caching.shipped import package_tables
from kerneltune._src.core import options
from kerneltune._src.execution.executor import Executor
from kerneltune._src.kernel.base import install_default_executor
from kerneltune._src.selection.chain import AutotunePolicy, ConfigSelectorChain

_default: Executor[Any, Any] | None = None
_default_lock = threading.Lock()


def default_executor() -> Executor[Any, Any]:
    """The executor `kernel(...)` uses: a memory cache, the persistent cache at
    `KERNELTUNE_CACHE_DIR` (the user cache dir by default; `off` disables it) and the
    policy `KERNELTUNE_AUTOTUNE` asks for (read when it is first built)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = _build_default()
    return _default


def set_default_executor(executor: Executor[Any, Any] | None) -> None:
    """Replaces the default executor; None rebuilds it from the environment on next use."""
    global _default
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(
            f"set_default_executor needs an Executor or None, got {type(executor).__qualname__}."
        )
    with _default_lock:
        _default = executor


def selector_of(selector: Any, what: str = "selector") -> ConfigSelectorChain[Any, Any]:
    """The `ConfigSelectorChain` an API argument names: the chain itself, an
    `Executor`'s chain, or the default executor's for None.

    Raises:
      TypeError: `selector` is none of those (the message names `what`).
    """
    if selector is None:
        selector = default_executor()
    chooser = getattr(selector, "chooser", None)  # an Executor
    if not isinstance(selector, ConfigSelectorChain) and isinstance(chooser, ConfigSelectorChain):
        selector = chooser
    if not isinstance(selector, ConfigSelectorChain):
        raise TypeError(
            f"{what} must be a ConfigSelectorChain (or an Executor using one), got "
            f"{type(selector).__qualname__}."
        )
    return selector


def _build_default() -> Executor[Any, Any]:
    persistent = default_persistent_cache()
    chain: ConfigSelectorChain[Any, Any] = ConfigSelectorChain(
        ConfigCache(),
        policy=AutotunePolicy.from_env(),
        persistent=persistent,
        shipped=package_tables() if options.SHIPPED.value else None,
    )
    return Executor(chain)


install_default_executor(default_executor)
