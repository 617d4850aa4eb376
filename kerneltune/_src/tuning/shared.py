"""Shared tuning: the processes of a job tune one key together, each timing a slice of
its candidates (the offline tuning of each family's first key, `workflows/split.py`).

Inside `tuning_shared`, every process times the heuristic, the warm-start hints and
every n-th of the other candidates from its own process id (`shared_slice`), publishes
its results under the full candidate list through JAX's coordination service, and all
adopt the fastest of all (`distributed.combine` without its coverage rule: each
candidate was measured by one process, the heuristic by all). A process that found the
key in its caches joins the round without results (`join_cached`), so the others do
not wait for it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kerneltune._src.core import keys
from kerneltune._src.core.coordination import PROTOCOL_FORMAT, Peers, current_peers
from kerneltune._src.tuning.distributed import (
    NOT_MEASURED,
    Agreement,
    alone,
    combine,
    payload,
    share,
)
from kerneltune._src.tuning.report import CandidateResult, TuningReport, format_seconds

logger = logging.getLogger("kerneltune")

# The keys this process joined a shared tuning of, while `tuning_shared` is active.
_shared: contextvars.ContextVar[set[tuple[str, str]] | None] = contextvars.ContextVar(
    "kerneltune_shared", default=None
)


@contextlib.contextmanager
def tuning_shared() -> Iterator[set[tuple[str, str]]]:
    """Inside the block, a key tuned under several processes is tuned together: each
    process times its slice of the candidates (`shared_slice`) and `agree` adopts the
    fastest of all. Yields the `(op_id_v, call_key)` of every key this process joined
    so: one it found in its caches instead must still `join_cached`, or the others
    wait for it."""
    joined: set[tuple[str, str]] = set()
    token = _shared.set(joined)
    try:
        yield joined
    finally:
        _shared.reset(token)


def _peers() -> Peers | None:
    if _shared.get() is None or alone():
        return None
    peers = current_peers()
    return peers if peers is not None and peers.num_processes > 1 else None


def shared_slice(candidates: Sequence[Any], keep: Sequence[Any] = ()) -> list[Any]:
    """The candidates this process times: all of them, or in a shared tuning the ones
    in `keep` (the heuristic, warm-start hints: every process times them) and every
    n-th of the rest from this process's id, in the candidates' order.

    Example:
      >>> shared_slice(["h", "a", "b", "c"], keep=["h"])  # one process: everything
      ['h', 'a', 'b', 'c']
    """
    peers = _peers()
    if peers is None:
        return list(candidates)
    kept = {i for i, c in enumerate(candidates) if c in keep}
    rest = [i for i in range(len(candidates)) if i not in kept]
    mine = kept | set(rest[peers.process_id :: peers.num_processes])
    return [c for i, c in enumerate(candidates) if i in mine]


def join_cached(op_id_v: str, call_key: str, *, timeout_s: float | None = None) -> None:
    """Joins a shared tuning of a key this process did not tune (its caches held a
    config, or its tuning failed first): publishes that it measured nothing, so the
    others need not wait for it. Nothing for a key it joined already."""
    peers = _peers()
    joined = _shared.get()
    if peers is None or joined is None or (op_id_v, call_key) in joined:
        return
    share(
        ("", op_id_v, call_key),  # the device is not part of the round's topic
        "tune-shared",
        {"format": PROTOCOL_FORMAT, "process": peers.process_id, "cached": True},
        what=f"a shared tuning of {op_id_v} (call key {call_key})",
        peers=peers,
        timeout_s=timeout_s,
    )
    joined.add((op_id_v, call_key))


def active() -> bool:
    """True inside `tuning_shared` in a job of several processes (not `tuning_alone`)."""
    return _peers() is not None


def agree(
    key: tuple[str, str, str],
    report: TuningReport,
    candidates: Sequence[Any],
    *,
    timeout_s: float | None = None,
) -> TuningReport:
    """Every process's slice of `candidates` together: `report` covers this process's
    slice (`shared_slice`), the returned report every candidate, each with the time of
    the process that measured it (the median where several did), `best` the fastest of
    all. Outside a shared tuning, `report` unchanged.

    Raises:
      AgreementTimeoutError: a process did not arrive in time.
      AgreementError: the processes tuned different candidate lists, or the
        coordination service failed.
    """
    peers = _peers()
    if peers is None:
        return report
    candidates = list(candidates)
    dev, op_id_v, call_key = key
    texts = [keys.stable_json(c) for c in candidates]
    timed = {keys.stable_json(c.cfg): c for c in report.candidates}
    full = [
        timed.get(t) or CandidateResult(cfg=c, status="pruned") for c, t in zip(candidates, texts)
    ]
    mine = payload(
        dataclasses.replace(report, candidates=tuple(full)),
        op_id_v=op_id_v,
        device=dev,
        process_id=peers.process_id,
    )
    everyone = share(
        key,
        "tune-shared",
        mine,
        what=f"a shared tuning of {report.name or op_id_v} (call key {call_key})",
        peers=peers,
        timeout_s=timeout_s,
    )
    joined = _shared.get()
    if joined is not None:
        joined.add((op_id_v, call_key))
    # A process that found the key in its caches measured nothing (`join_cached`).
    payloads = {pid: p for pid, p in everyone.items() if "status" in p}
    agreement = combine(payloads, candidates, by_coverage=False)
    merged = tuple(_with_others(c, i, agreement, payloads) for i, c in enumerate(full))
    best = candidates[agreement.winner] if agreement.winner is not None else None
    logger.info(
        "tuned %s shared by %d processes: %s",
        report.name or op_id_v,
        len(payloads),
        "no winner"
        if best is None
        else f"{best} at {format_seconds(agreement.combined_s[agreement.winner])}",  # type: ignore[index]
    )
    return dataclasses.replace(
        report,
        best=best,
        candidates=merged,
        strategy=f"{report.strategy}, shared by {len(payloads)} processes",
    )


def _with_others(
    mine: CandidateResult, i: int, agreement: Agreement, payloads: Mapping[int, Mapping[str, Any]]
) -> CandidateResult:
    """Candidate `i` as the job saw it: this process's result where it timed it, else
    another process's time or failure."""
    if mine.status != "pruned":
        return mine
    if i in agreement.excluded:  # failed on another process, or measured on none
        failures = [p["status"][i] for _, p in sorted(payloads.items())]
        status = next((f for f in failures if f not in ("ok", *NOT_MEASURED)), None)
        if status is not None:
            return CandidateResult(cfg=mine.cfg, status=status, error=agreement.excluded[i])  # type: ignore[arg-type]
        return mine
    time_s = agreement.combined_s[i]
    return mine if time_s is None else CandidateResult(cfg=mine.cfg, status="ok", time_s=time_s)
