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

import contextlib
import contextvars
import dataclasses
import json
import logging
import statistics
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kerneltune._src.core import files, keys
from kerneltune._src.core.coordination import (
    PROTOCOL_FORMAT,
    Peers,
    current_peers,
    exchange_round,
    timeout_seconds,
)
from kerneltune._src.core.coordination import (
    AgreementError as AgreementError,
)
from kerneltune._src.core.coordination import (
    AgreementTimeoutError as AgreementTimeoutError,
)
from kerneltune._src.tuning.report import TuningReport, format_seconds
from kerneltune._src.tuning.winner import ties

logger = logging.getLogger("kerneltune")

# A candidate that was not measured but did not fail either (the search skipped it).
NOT_MEASURED = ("pruned",)


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
        "format": PROTOCOL_FORMAT,
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


def combine(
    payloads: Mapping[int, Mapping[str, Any]], cfgs: Sequence[Any], *, by_coverage: bool = True
) -> Agreement:
    """Picks the winner from every process's payload; a pure function of its inputs,
    so every process that calls it with the same payloads gets the same answer.

    Rules: a candidate that failed on any process cannot win (it would not run
    there); of the rest, the one measured by the most processes wins (unless
    `by_coverage` is False: a shared tuning measures each candidate once), then the one
    with the lowest median over processes of the per-process medians, then the one
    whose `stable_json` is smallest; but among those that tie with that lowest
    median (`winner.ties`), the earliest candidate wins (the heuristic, which the chain lists
    first, as `winner.fastest` decides in one process).

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
            elif status not in NOT_MEASURED:
                failed.append(f"{status} on process {pid}")
        combined.append(statistics.median(times) if times else None)
        coverage.append(len(times))
        if failed:
            excluded[i] = ", ".join(failed)
        elif not times:
            excluded[i] = "measured on no process"
    texts = [_cfg_text(c) for c in cfgs]
    eligible = [i for i in range(n) if i not in excluded]

    def rank(i: int) -> tuple[int, float, str]:
        return (-coverage[i] if by_coverage else 0, combined[i], texts[i])  # type: ignore[return-value]

    winner = min(eligible, key=rank) if eligible else None
    if winner is not None:
        # As one process decides (`winner.fastest`): within the noise band of the
        # lowest, the earliest candidate wins, and the chain lists the heuristic first.
        lowest, coverage_rank = combined[winner], rank(winner)[0]
        assert lowest is not None
        winner = next(
            i
            for i in eligible
            if rank(i)[0] == coverage_rank and ties(combined[i], lowest)  # type: ignore[arg-type]
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


_alone: contextvars.ContextVar[bool] = contextvars.ContextVar("kerneltune_alone", default=False)


def alone() -> bool:
    """True inside `tuning_alone`."""
    return _alone.get()


@contextlib.contextmanager
def tuning_alone() -> Iterator[None]:
    """Inside the block, `agree` keeps each process's own winner: the keys tuned there
    are tuned by this process only (the others adopt its results afterwards)."""
    token = _alone.set(True)
    try:
        yield
    finally:
        _alone.reset(token)


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
    if _alone.get():
        return report  # this key is this process's alone (offline tuning split by key)
    if peers is None:
        peers = current_peers()
        if peers is None:
            return report
    dev, op_id_v, call_key = key
    what = f"a config for {report.name or op_id_v} (call key {call_key})"
    # The device is not part of the topic: processes on different device kinds must
    # still run one program, so they agree too (with a warning, below).
    mine = payload(report, op_id_v=op_id_v, device=dev, process_id=peers.process_id)
    payloads = share(key, "tune", mine, what=what, peers=peers, timeout_s=timeout_s)
    cfgs = [c.cfg for c in report.candidates]
    agreement = combine(payloads, cfgs)
    _log(agreement, payloads, cfgs, report, peers)
    best = cfgs[agreement.winner] if agreement.winner is not None else None
    return dataclasses.replace(report, best=best)


def share(
    key: tuple[str, str, str],
    kind: str,
    value: Mapping[str, Any],
    *,
    what: str,
    peers: Peers | None = None,
    timeout_s: float | None = None,
) -> dict[int, Mapping[str, Any]]:
    """Every process's `value` about `key`, by process id: an exchange through the
    coordination service, so that processes can decide together what to do before
    tuning (e.g. which candidates a first call times). With one process, or inside
    `tuning_alone`, just this process's.

    Raises:
      AgreementTimeoutError: a process did not arrive in time.
      AgreementError: the coordination service failed.
    """
    if _alone.get():
        return {0: value}
    if peers is None:
        peers = current_peers()
        if peers is None:
            return {0: value}
    _, op_id_v, call_key = key
    raw = exchange_round(
        peers,
        kind,
        op_id_v,
        call_key,
        value=json.dumps(dict(value), sort_keys=True, allow_nan=False),
        timeout_s=timeout_seconds(timeout_s),
        what=what,
    )
    return {pid: files.loads(text) for pid, text in sorted(raw.items())}


def _log(
    agreement: Agreement,
    payloads: Mapping[int, Mapping[str, Any]],
    cfgs: Sequence[Any],
    report: TuningReport,
    peers: Peers,
) -> None:
    for field, differ in (
        ("device", "run on different devices"),
        ("timer", "measured with different timers"),
    ):
        seen = sorted({str(p.get(field)) for p in payloads.values()})
        if len(seen) > 1:
            logger.warning(
                "processes agreeing on %s %s (%s): their timings are combined as if they "
                "were comparable.",
                report.name,
                differ,
                ", ".join(seen),
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
        format_seconds(agreement.combined_s[agreement.winner]),
        note,
    )
