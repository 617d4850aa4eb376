"""The result entry of one tuned record: from the tuning's report, or from what the
caches hold (timings from the persistent cache when it has them)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from kerneltune._src.caching.cache_entry import UNTUNED_STRATEGY, report_fields
from kerneltune._src.caching.result import Entry
from kerneltune._src.kernel.recording import Record
from kerneltune._src.selection.chain import ConfigSelectorChain, Decision


def _type_name(cfg: Any) -> str:
    t = type(cfg)
    return "" if isinstance(cfg, dict) else f"{t.__module__}.{t.__qualname__}"


def from_report(record: Record, decision: Decision) -> Entry:
    report = decision.report
    fields = report_fields(report)
    return Entry(
        record.op_id_v,
        record.call_key,
        decision.cfg,
        timings=tuple(fields.get("timings", ())),
        signature=record.signature,
        cfg_type=_type_name(decision.cfg),
        timer=fields.get("timer"),
        best_time_s=fields.get("best_time_s"),
        heuristic_time_s=fields.get("heuristic_time_s"),
        created=time.time(),
        heuristic_cfg=fields.get("heuristic_cfg"),
        strategy=fields.get("strategy"),
        wall_s=fields.get("wall_s"),
    )


def untuned(record: Record, decision: Decision, why: str) -> Entry:
    """The entry of a call with nothing to tune: its heuristic config, with why in its
    strategy (`Entry.untuned`); never written to a cache by an import or a merge."""
    return Entry(
        record.op_id_v,
        record.call_key,
        decision.cfg,
        signature=record.signature,
        cfg_type=_type_name(decision.cfg),
        created=time.time(),
        strategy=f"{UNTUNED_STRATEGY}: {why}",
    )


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
        return Entry(
            record.op_id_v,
            record.call_key,
            decision.cfg,
            signature=record.signature,
            cfg_type=_type_name(decision.cfg),
            created=time.time(),
        )
    return Entry(
        record.op_id_v,
        record.call_key,
        decision.cfg,
        timings=tuple(stored.candidates),
        signature=record.signature,
        cfg_type=_type_name(decision.cfg),
        timer=stored.timer,
        best_time_s=stored.best_time_s,
        heuristic_time_s=stored.heuristic_time_s,
        created=stored.created,
        heuristic_cfg=stored.heuristic_cfg,
        strategy=stored.strategy,
        wall_s=stored.wall_s,
    )
