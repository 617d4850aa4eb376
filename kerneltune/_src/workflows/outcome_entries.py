"""The result entry of one tuned record: from the tuning's report, or from what the
caches hold (timings from the persistent cache when it has them)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from kerneltune._src.caching.cache_entry import UNTUNED_STRATEGY, report_fields
from kerneltune._src.caching.result import Entry
from kerneltune._src.kernel.recording import Record
from kerneltune._src.selection.chain import ConfigSelectorChain
from kerneltune._src.selection.decision import Decision


def _type_name(cfg: Any) -> str:
    t = type(cfg)
    return "" if isinstance(cfg, dict) else f"{t.__module__}.{t.__qualname__}"


#: What an entry says about how its call was tuned, as a report or a stored entry has it.
_TUNING_FIELDS = (
    "timings",
    "timer",
    "best_time_s",
    "heuristic_time_s",
    "heuristic_cfg",
    "strategy",
    "wall_s",
)


def _entry(record: Record, decision: Decision, **fields: Any) -> Entry:
    """The entry of `record`'s call with the config of `decision`, and `fields`."""
    return Entry(
        record.op_id_v,
        record.call_key,
        decision.cfg,
        signature=record.signature,
        cfg_type=_type_name(decision.cfg),
        **fields,
    )


def from_report(record: Record, decision: Decision) -> Entry:
    fields = report_fields(decision.report)
    tuning = {name: fields[name] for name in _TUNING_FIELDS if name in fields}
    return _entry(record, decision, created=time.time(), **tuning)


def untuned(record: Record, decision: Decision, why: str) -> Entry:
    """The entry of a call with nothing to tune: its heuristic config, with why in its
    strategy (`Entry.untuned`); never written to a cache by an import or a merge."""
    return _entry(record, decision, created=time.time(), strategy=f"{UNTUNED_STRATEGY}: {why}")


def from_caches(record: Record, chain: ConfigSelectorChain[Any, Any], decision: Decision) -> Entry:
    key = (decision.device, decision.op_id_v, decision.call_key)
    report = chain.report_for(*key)
    if report is not None:
        return from_report(record, dataclasses.replace(decision, report=report))
    stored = None
    source = chain.shipped if decision.tier == "shipped" else chain.persistent
    if source is not None:
        try:
            stored = source.get_entry(*key)
        except Exception:  # timings are a bonus.
            stored = None
    if stored is None:
        return _entry(record, decision, created=time.time())
    tuning = {name: getattr(stored, name) for name in _TUNING_FIELDS}
    return _entry(record, decision, created=stored.created, **tuning)
