"""What a selection reports: the `Decision` (the tier that supplied the config and why
the tiers before it missed, as `explain` shows it), and the error raised when every
tier missed."""

from __future__ import annotations

import dataclasses
from typing import Any

from kerneltune._src.caching.cache import CacheKey
from kerneltune._src.kernel.base import Invocation
from kerneltune._src.selection import tiers
from kerneltune._src.selection.policy import AutotunePolicy, CacheMissError
from kerneltune._src.tuning.report import TuningReport


@dataclasses.dataclass
class Decision:
    """How one config was chosen (what `explain` shows)."""

    tier: tiers.TierName
    cfg: Any
    device: str
    op_id_v: str
    call_key: str
    signature: str
    misses: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    report: TuningReport | None = None
    #: How a first-call budget shaped the config (None when it did not).
    budget: str | None = None


def no_config_error(
    inv: Invocation[Any, Any],
    key: CacheKey,
    policy: AutotunePolicy,
    misses: list[tuple[str, str]],
) -> Exception:
    """The error to raise when every tier missed: a `CacheMissError` in production mode,
    else a RuntimeError that lists what each tier said."""
    where = f"{inv.op_id_v} with arguments ({inv.signature}) on {key[0]}"
    if policy.cache_miss_fallback == "error":
        return CacheMissError(
            f"no cached config for {where} (call key {inv.call_key}), and the policy "
            "forbids tuning at run time (cache_miss_fallback='error'). Tune offline and "
            "ship the cache, or allow autotuning."
        )
    tried = "; ".join(f"{tier}: {why}" for tier, why in misses)
    return RuntimeError(f"no config for {where}. Tried: {tried}.")
