"""Verifying that every process of a job holds the same configs (`verify_agreement`).

Agreement while tuning (`distributed.py`) makes processes pick the same winner; this
checks afterwards, from whatever holds the configs (the default executor, a cache, a
result), that they did. It sits above the executor: it reads the default executor.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from kerneltune._src.caching.cache import ConfigCache
from kerneltune._src.caching.result import AutotuningResult
from kerneltune._src.core import devices, files, keys
from kerneltune._src.core.coordination import (
    PROTOCOL_FORMAT,
    AgreementError,
    Peers,
    current_peers,
    exchange_round,
    timeout_seconds,
)
from kerneltune._src.execution.default import selector_of
from kerneltune._src.execution.executor import Executor

logger = logging.getLogger("kerneltune")


@dataclasses.dataclass(frozen=True)
class AgreementCheck:
    """The result of `verify_agreement`.

    Attributes:
      processes: how many processes took part.
      keys: how many distinct `(op_id_v, call_key)` keys some process held.
      digest: a digest of this process's configs (equal everywhere when all agree).
      conflicts: `(op_id_v, call_key)` → {config as stable JSON: process ids holding
        it}, for keys whose processes hold different configs.
      partial: `(op_id_v, call_key)` → the process ids holding it, for keys that only
        some processes hold (not an error in itself: a process may have made an extra
        call, e.g. an evaluation step).
    """

    processes: int
    keys: int
    digest: str
    conflicts: Mapping[tuple[str, str], Mapping[str, tuple[int, ...]]]
    partial: Mapping[tuple[str, str], tuple[int, ...]]

    @property
    def ok(self) -> bool:
        """True when no key has different configs on different processes."""
        return not self.conflicts

    def summary(self) -> str:
        if self.ok:
            extra = f"; {len(self.partial)} held by only some processes" if self.partial else ""
            return (
                f"all {self.processes} processes agree on {self.keys} configs (digest "
                f"{self.digest}){extra}"
            )
        lines = [f"{len(self.conflicts)} of {self.keys} configs differ between processes:"]
        for (op, call_key), holders in sorted(self.conflicts.items())[:10]:
            held = "; ".join(f"processes {list(p)}: {cfg}" for cfg, p in sorted(holders.items()))
            lines.append(f"  {op} (call key {call_key}): {held}")
        if len(self.conflicts) > 10:
            lines.append(f"  … and {len(self.conflicts) - 10} more")
        return "\n".join(lines)


def verify_agreement(
    source: Any = None,
    *,
    timeout_s: float | None = None,
    raise_on_mismatch: bool = True,
    peers: Peers | None = None,
) -> AgreementCheck:
    """Confirms that every process holds the same configs for the keys it used.

    Every process must call it (it waits for all of them). Each publishes the configs
    it holds for this device — `(op_id_v, call_key) → config` — and compares them with
    everyone else's. Call it after a warm-up step, or at start-up after loading a
    shipped cache into an overlay or memory cache.

    Args:
      source: where the configs are: None (the default executor's memory cache), an
        `Executor`, a `ConfigSelectorChain`, a `ConfigCache`, an `AutotuningResult`, or
        a mapping `{(device, op_id_v, call_key): cfg}`.
      timeout_s: how long to wait for the others (default: `KERNELTUNE_AGREE_TIMEOUT`).
      raise_on_mismatch: raise when some key has different configs on different
        processes (else just return the check).
      peers: the processes (default: those of `jax.distributed`).

    Returns:
      An `AgreementCheck`; with one process it trivially agrees.

    Raises:
      AgreementError: configs differ and `raise_on_mismatch` is true.
      AgreementTimeoutError: a process did not call `verify_agreement` in time.

    Example:
      >>> import kerneltune
      >>> from kerneltune import verify_agreement
      >>> verify_agreement(kerneltune.ConfigCache()).ok  # one process: nothing to compare
      True
    """
    entries = _entries_of(source)
    digest = keys.hash_text(keys.stable_json(sorted(entries.items())), 16)
    if peers is None:
        peers = current_peers()
    if peers is None:
        return AgreementCheck(
            processes=1, keys=len(entries), digest=digest, conflicts={}, partial={}
        )
    wait_s = timeout_seconds(timeout_s)
    mine = {"format": PROTOCOL_FORMAT, "entries": sorted([*k, v] for k, v in entries.items())}
    raw = exchange_round(
        peers, "verify", value=json.dumps(mine), timeout_s=wait_s, what="verify_agreement()"
    )
    held: dict[tuple[str, str], dict[str, list[int]]] = {}
    for pid, text in sorted(raw.items()):
        for op, call_key, cfg_text in files.loads(text)["entries"]:
            held.setdefault((op, call_key), {}).setdefault(cfg_text, []).append(pid)
    conflicts = {k: {c: tuple(p) for c, p in v.items()} for k, v in held.items() if len(v) > 1}
    partial = {
        k: tuple(sorted(p for pids in v.values() for p in pids))
        for k, v in held.items()
        if len(v) == 1 and sum(len(p) for p in v.values()) < peers.num_processes
    }
    check = AgreementCheck(
        processes=peers.num_processes,
        keys=len(held),
        digest=digest,
        conflicts=conflicts,
        partial=partial,
    )
    if not check.ok and raise_on_mismatch:
        raise AgreementError(f"process {peers.process_id}: {check.summary()}")
    if check.ok:
        logger.info("verify_agreement: %s", check.summary())
    return check


def _entries_of(source: Any) -> dict[tuple[str, str], str]:
    """`(op_id_v, call_key) → stable JSON of the config` for this device's entries."""
    if source is None or isinstance(source, Executor):
        source = selector_of(source)
    if not isinstance(source, (ConfigCache, AutotuningResult, Mapping)):
        cache = getattr(source, "cache", None)  # a ConfigSelectorChain
        if not isinstance(cache, ConfigCache):
            raise TypeError(
                "verify_agreement's source must be None, an Executor, a ConfigSelectorChain, "
                "a ConfigCache, an AutotuningResult or a mapping {(device, op_id_v, "
                f"call_key): cfg}}, got {type(source).__qualname__}."
            )
        source = cache
    if isinstance(source, AutotuningResult):
        items = list(source.as_overlay().items())
    elif isinstance(source, ConfigCache):
        items = source.items()
    else:
        items = list(source.items())
    here = devices.device_fingerprint()
    return {
        (op, call_key): keys.stable_json(cfg) for (dev, op, call_key), cfg in items if dev == here
    }
