"""`explain`: which tier supplied a call's config, and why the others missed."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from kerneltune._src.caching.cache_entry import CacheEntry
from kerneltune._src.core.configs import config_to_dict, current_names
from kerneltune._src.kernel.base import Kernel
from kerneltune._src.selection.chain import ConfigSelectorChain
from kerneltune._src.selection.decision import Decision
from kerneltune._src.tuning.report import TuningReport

_TIER_TEXT = {
    "override": "an explicit cfg= argument",
    "overlay": "an active overlay (overlay_cache or `with AutotuningResult`)",
    "memory": "the in-memory cache",
    "persistent": "the persistent cache",
    "autotune": "autotuning just now",
    "reuse": "an earlier autotuning of the same key in this process",
    "predicted": "a prediction from tuned calls nearby (untimed)",
    "heuristics": "the kernel's heuristic",
    "chooser": "a custom chooser",
}


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The story of one config choice; `str()` gives a readable report."""

    op_id_v: str
    call_key: str
    device: str
    signature: str
    tier: str
    cfg: Any
    misses: tuple[tuple[str, str], ...] = ()
    report: TuningReport | None = None
    #: The persistent cache's entry, when the config came from it: its stored timings.
    stored: CacheEntry | None = None
    #: How a first-call budget shaped the config: tuned on a shortlist the prediction
    #: ranked best, or predicted and used untimed (None when no budget played a part).
    budget: str | None = None

    @property
    def budgeted(self) -> bool:
        """Whether the config was tuned under a first-call budget or predicted untimed
        (so a full tuning, `kt.autotune` or `kerneltune tune`, would still search)."""
        return self.budget is not None

    def __str__(self) -> str:
        lines = [
            f"{self.op_id_v}({self.signature}) on {self.device}",
            f"  call key: {self.call_key}",
            f"  config:   {self.cfg!r}",
            f"  from:     {_TIER_TEXT.get(self.tier, self.tier)}",
        ]
        if self.budget is not None:
            lines.append(f"  budget:   {self.budget}")
        if self.misses:
            lines.append("  tiers before it:")
            lines += [f"    {tier}: {why}" for tier, why in self.misses]
        if self.report is not None:
            checked = (
                f"outputs validated against {self.report.validated_by}"
                if self.report.validated_by
                else "outputs not validated"
            )
            lines.append(
                f"  tuned with the {self.report.timer} timer in {self.report.wall_s:.2f} s, "
                f"{checked}:"
            )
            ranked = sorted(
                self.report.candidates, key=lambda c: (c.time_s is None, c.time_s or 0.0)
            )
            for c in ranked:
                mark = "*" if c.cfg == self.report.best else " "
                when = (
                    f"{c.time_s * 1e3:9.4f} ms"
                    if c.time_s is not None
                    else f"{c.status}: {c.error}"
                )
                lines.append(f"   {mark} {when}  {c.cfg!r}")
        if self.stored is not None:
            lines += stored_timings(self.stored)
        return "\n".join(lines)


def _fields(cfg: Any) -> str:
    """A stored config's set fields, `bm=64 bn=32` (None fields are defaults)."""
    if not isinstance(cfg, dict):
        return str(cfg)
    return " ".join(f"{k}={v}" for k, v in sorted(cfg.items()) if v is not None)


def stored_timings(entry: CacheEntry) -> list[str]:
    """Lines describing what a persistent cache entry recorded about its tuning."""
    e = entry
    took = f" in {e.wall_s:.2f} s" if e.wall_s else ""
    lines = [
        f"  stored {time.strftime('%Y-%m-%d %H:%M', time.localtime(e.created))} "
        f"({e.provenance}{', under a first-call budget' if e.budgeted else ''}), tuned with "
        f"the {e.timer or '?'} timer{took}, at {e.path}:"
    ]
    ranked = sorted(e.candidates, key=lambda c: (c.get("time_s") is None, c.get("time_s") or 0))
    winner = config_to_dict(e.cfg)
    for c in ranked:
        mark = "*" if current_names(c.get("cfg"), type(e.cfg)) == winner else " "
        t = c.get("time_s")
        when = f"{t * 1e3:9.4f} ms" if t is not None else f"{c.get('status')}: {c.get('error')}"
        lines.append(f"   {mark} {when}  {_fields(c.get('cfg'))}")
    if not e.candidates:
        lines.append("    (no candidate timings stored: imported or hand-written)")
    return lines


def explain(
    kernel: Kernel[Any, Any],
    *args: Any,
    executor: Any = None,
    cfg: Any = None,
    method: str | None = None,
    mesh: Any = None,
    in_specs: Any = None,
    out_specs: Any = None,
    **kwargs: Any,
) -> Explanation:
    """Chooses the config for `kernel(*args, **kwargs)` (as a call would: this may
    tune) and explains the choice: the tier that supplied it, the key, the candidates
    and their timings when it was tuned in this process, and why earlier tiers missed.

    Args:
      kernel: the kernel.
      *args: the call's positional arguments (arrays or `jax.ShapeDtypeStruct`s).
      **kwargs: its keyword arguments.
      executor: the executor to ask (default: the default executor).
      cfg: an explicit config, to explain an override.
      method: the call's `method` ("shard_map" to run per shard, as the executor
        takes it; the config is then chosen for one shard's shapes).
      mesh: the call's mesh, with `method="shard_map"`.
      in_specs: the call's input partition specs, with `method="shard_map"`.
      out_specs: the call's output partition specs, with `method="shard_map"`.
    """
    from kerneltune._src.execution.default import default_executor

    ex = executor if executor is not None else default_executor()
    call = dict(method=method, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    inv = ex.invocation(kernel, *args, cfg=cfg, **call, **kwargs)
    chooser = ex.chooser
    if not isinstance(chooser, ConfigSelectorChain):
        chosen = chooser.choose(inv, kernel)
        return Explanation(
            inv.op_id_v, inv.call_key, inv.device_fingerprint, inv.signature, "chooser", chosen
        )
    decision: Decision = chooser.decide(inv, kernel)
    report = decision.report or chooser.report_for(
        decision.device, decision.op_id_v, decision.call_key
    )
    return Explanation(
        op_id_v=decision.op_id_v,
        call_key=decision.call_key,
        device=decision.device,
        signature=decision.signature,
        tier=decision.tier,
        cfg=decision.cfg,
        misses=tuple(decision.misses),
        report=report if decision.tier in ("autotune", "reuse", "memory") else None,
        stored=_stored_entry(chooser, decision) if decision.tier == "persistent" else None,
        budget=decision.budget,
    )


def _stored_entry(chain: ConfigSelectorChain[Any, Any], decision: Decision) -> CacheEntry | None:
    get_entry = getattr(chain.persistent, "get_entry", None)
    if get_entry is None:
        return None
    entry: CacheEntry | None = get_entry(decision.device, decision.op_id_v, decision.call_key)
    return entry
