"""Multi-process agreement: every process ends with the same config for the same key.

In an SPMD job every process compiles the same program, so every process must pick the
same config for each kernel call. Tuning on each host independently does not give that:
timing noise alone makes hosts disagree, and different configs mean different programs
(a hang, or silent divergence). `docs/cluster.md` has the long form of the design:

- every process tunes the key on its own device, exactly as it would alone;
- each publishes its per-candidate outcome (status, median time) to the key-value store
  of JAX's distributed runtime (set up by `jax.distributed.initialize`), under a key
  made from the op, the call key and a per-key round number;
- each reads every process's outcome and applies the same pure function (`combine`) to
  the same data, so each computes the same winner: among the candidates that failed on
  no process, the one measured by the most processes, then with the lowest median over
  processes of the per-process medians, then the smallest `stable_json` of its config.

This is host-side messaging, not an XLA collective: it works while the call is being
traced inside `jax.jit`, and processes may arrive at different times. A process that
does not arrive within `KERNELTUNE_AGREE_TIMEOUT` seconds makes the others raise
`AgreementTimeoutError`, naming the op and the missing processes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from kerneltune._src import devices, files, keys
from kerneltune._src.coordination import (
    AgreementError as AgreementError,
)
from kerneltune._src.coordination import (
    AgreementTimeoutError as AgreementTimeoutError,
)
from kerneltune._src.coordination import (
    Peers,
    current_peers,
    exchange,
    finish_round,
    next_round,
    timeout_seconds,
    topic_hash,
)
from kerneltune._src.tuning.report import TuningReport

logger = logging.getLogger("kerneltune")

_FORMAT = 1
_ROOT = "kerneltune"
# A candidate that was not measured but did not fail either (the search skipped it).
_NOT_MEASURED = ("pruned",)


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What the processes agreed on for one key.

    Attributes:
      winner: the index of the agreed candidate, or None when every candidate failed on
        some process (each process then falls back the same way, e.g. to the
        heuristic).
      combined_s: per candidate, the median over processes of its per-process median
        time (None when no process measured it).
      coverage: per candidate, how many processes measured it.
      excluded: candidate index → why it could not win (e.g. "run_error on process 2").
      local_winners: process id → the candidate that process alone found fastest.
    """

    winner: int | None
    combined_s: tuple[float | None, ...]
    coverage: tuple[int, ...]
    excluded: Mapping[int, str]
    local_winners: Mapping[int, int | None]


def payload(report: TuningReport, *, op_id_v: str, device: str, process_id: int) -> dict[str, Any]:
    """What one process publishes about its tuning of a key."""
    return {
        "format": _FORMAT,
        "process": process_id,
        "op": op_id_v,
        "device": device,
        "timer": report.timer,
        "candidates": candidates_digest([c.cfg for c in report.candidates]),
        "status": [_status(c) for c in report.candidates],
        "time_s": [c.time_s if c.ok else None for c in report.candidates],
    }


def _status(c: Any) -> str:
    if c.ok:
        return "ok"
    # "ok" without a time was never measured; it did not fail either.
    return "pruned" if c.status == "ok" else str(c.status)


def candidates_digest(cfgs: Sequence[Any]) -> str:
    """A digest of the candidate list, identical in every process that has the same
    candidates in the same order."""
    return keys.hash_text(keys.stable_json([_cfg_text(c) for c in cfgs]))


def _cfg_text(cfg: Any) -> str:
    return keys.stable_json(cfg)


def combine(payloads: Mapping[int, Mapping[str, Any]], cfgs: Sequence[Any]) -> Agreement:
    """Picks the winner from every process's payload; a pure function of its inputs,
    so every process that calls it with the same payloads gets the same answer.

    Rules: a candidate that failed on any process cannot win (it would not run
    there); of the rest, the one measured by the most processes wins, then the one
    with the lowest median over processes of the per-process medians, then the one
    whose `stable_json` is smallest.

    Raises:
      AgreementError: the processes tuned different candidate lists.
    """
    digests: dict[str, list[int]] = {}
    for pid, p in sorted(payloads.items()):
        digests.setdefault(f"{p['candidates']} ({len(p['status'])} candidates)", []).append(pid)
    if len(digests) > 1:
        groups = "; ".join(f"processes {pids}: {d}" for d, pids in digests.items())
        op = next(iter(payloads.values())).get("op", "?")
        raise AgreementError(
            f"the processes tuned different candidate lists for {op}, so they cannot agree "
            f"on one: {groups}. Candidate lists must not depend on the process (or on "
            "anything that differs between hosts)."
        )
    n = len(cfgs)
    if any(len(p["status"]) != n for p in payloads.values()):
        raise AgreementError(
            f"the processes' results have {len(next(iter(payloads.values()))['status'])} "
            f"candidates but this process has {n}; candidate lists must not change between "
            "attempts to agree on one key."
        )
    combined: list[float | None] = []
    coverage: list[int] = []
    excluded: dict[int, str] = {}
    for i in range(n):
        times: list[float] = []
        failed: list[str] = []
        for pid, p in sorted(payloads.items()):
            status, t = p["status"][i], p["time_s"][i]
            if status == "ok" and t is not None:
                times.append(float(t))
            elif status not in _NOT_MEASURED:
                failed.append(f"{status} on process {pid}")
        combined.append(statistics.median(times) if times else None)
        coverage.append(len(times))
        if failed:
            excluded[i] = ", ".join(failed)
        elif not times:
            excluded[i] = "measured on no process"
    texts = [_cfg_text(c) for c in cfgs]
    eligible = [i for i in range(n) if i not in excluded]
    winner = (
        min(eligible, key=lambda i: (-coverage[i], combined[i], texts[i])) if eligible else None
    )
    local = {pid: _local_winner(p) for pid, p in sorted(payloads.items())}
    return Agreement(
        winner=winner,
        combined_s=tuple(combined),
        coverage=tuple(coverage),
        excluded=excluded,
        local_winners=local,
    )


def _local_winner(p: Mapping[str, Any]) -> int | None:
    best = None
    for i, (status, t) in enumerate(zip(p["status"], p["time_s"])):
        if status == "ok" and t is not None and (best is None or t < p["time_s"][best]):
            best = i
    return best


def agree(
    key: tuple[str, str, str],
    report: TuningReport,
    *,
    peers: Peers | None = None,
    timeout_s: float | None = None,
) -> TuningReport:
    """Makes every process end with the same winner for `key`.

    With one process, returns `report` unchanged. Otherwise publishes this process's
    per-candidate results, waits for every other process's, and returns `report` with
    `best` replaced by the winner `combine` picks from all of them (the timings in the
    report stay this process's own).

    Args:
      key: `(device_fingerprint, "<op_id>@v<version>", call_key)`.
      report: this process's tuning report for `key`.
      peers: the processes (default: `current_peers()`).
      timeout_s: how long to wait for the others (default: `KERNELTUNE_AGREE_TIMEOUT`).

    Raises:
      AgreementTimeoutError: a process did not arrive in time.
      AgreementError: the processes tuned different candidate lists, or the
        coordination service failed.
    """
    if peers is None:
        peers = current_peers()
        if peers is None:
            return report
    wait_s = timeout_seconds(timeout_s)
    dev, op_id_v, call_key = key
    what = f"a config for {report.name or op_id_v} (call key {call_key})"
    # The device is not part of the topic: processes on different device kinds must
    # still run one program, so they agree too (with a warning, below).
    topic = topic_hash("tune", op_id_v, call_key)
    round_ = next_round(peers, topic)
    mine = payload(report, op_id_v=op_id_v, device=dev, process_id=peers.process_id)
    raw = exchange(
        peers,
        f"{_ROOT}/agree/v{_FORMAT}/{topic}/{round_}",
        json.dumps(mine, sort_keys=True, allow_nan=False),
        timeout_s=wait_s,
        what=what,
    )
    finish_round(peers, topic, round_)
    payloads = {pid: files.loads(text) for pid, text in raw.items()}
    cfgs = [c.cfg for c in report.candidates]
    agreement = combine(payloads, cfgs)
    _log(agreement, payloads, cfgs, report, peers)
    best = cfgs[agreement.winner] if agreement.winner is not None else None
    return dataclasses.replace(report, best=best)


def _log(
    agreement: Agreement,
    payloads: Mapping[int, Mapping[str, Any]],
    cfgs: Sequence[Any],
    report: TuningReport,
    peers: Peers,
) -> None:
    fingerprints = sorted({str(p.get("device")) for p in payloads.values()})
    if len(fingerprints) > 1:
        logger.warning(
            "processes agreeing on %s run on different devices (%s): their timings are "
            "combined as if they were comparable.",
            report.name,
            ", ".join(fingerprints),
        )
    timers = sorted({str(p.get("timer")) for p in payloads.values()})
    if len(timers) > 1:
        logger.warning(
            "processes agreeing on %s measured with different timers (%s): their timings "
            "are combined as if they were comparable.",
            report.name,
            ", ".join(timers),
        )
    what = report.name or "kernel"
    if agreement.winner is None:
        logger.info(
            "no candidate for %s succeeded on every one of %d processes (%s); every "
            "process falls back the same way.",
            what,
            peers.num_processes,
            "; ".join(f"{cfgs[i]}: {why}" for i, why in sorted(agreement.excluded.items())[:5]),
        )
        return
    differing = {pid: w for pid, w in agreement.local_winners.items() if w != agreement.winner}
    note = (
        "; alone, "
        + ", ".join(
            f"process {pid} would have picked {cfgs[w] if w is not None else 'nothing'}"
            for pid, w in sorted(differing.items())
        )
        if differing
        else ""
    )
    logger.info(
        "agreed on %s for %s across %d processes (median of the processes' medians %s)%s",
        cfgs[agreement.winner],
        what,
        peers.num_processes,
        _fmt_s(agreement.combined_s[agreement.winner]),
        note,
    )


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


# -- verifying that processes hold the same configs -----------------------------------


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
    topic = topic_hash("verify")
    round_ = next_round(peers, topic)
    mine = json.dumps({"format": _FORMAT, "entries": sorted([*k, v] for k, v in entries.items())})
    raw = exchange(
        peers,
        f"{_ROOT}/verify/v{_FORMAT}/{round_}",
        mine,
        timeout_s=wait_s,
        what="verify_agreement()",
    )
    finish_round(peers, topic, round_)
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
    from kerneltune._src.cache import ConfigCache
    from kerneltune._src.executor import Executor, default_executor
    from kerneltune._src.result import AutotuningResult

    if source is None:
        source = default_executor()
    if isinstance(source, Executor):
        source = source.chooser
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
    return {(op, call_key): _cfg_text(cfg) for (dev, op, call_key), cfg in items if dev == here}
