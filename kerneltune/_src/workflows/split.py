"""Offline tuning split across the processes of a JAX job.

Under `jax.distributed`, `autotune_recorded`, `autotune_lowered` and `kt.autotune(f)`
tune each key once in the whole job instead of once per process:

1. the processes exchange the keys they hold;
2. of the keys every process holds, the costliest of each family (calls that differ
   only in sizes) of two or more is a *seed*: every process tunes it together, each
   timing a slice of its candidates (`distributed.tuning_shared`). A family's first key
   is the dear one: it searches its space cold, while the others start warm from its
   winner (a GPT block on an H200: 11 s for the first matmul, 2 s for each of three
   more). Dealt whole, every process paid a cold search of its own and 2 GPUs bought
   0.84x. A family of one key is dealt whole: its one cold search is needed anyway,
   and tuned together every process would repeat its fixed work (inputs, reference,
   the heuristic's compile);
3. the other keys every process holds are dealt by estimated cost (the same deal
   everywhere: `tune_workers.deal_by_cost`), a key only some hold goes to the
   lowest-numbered of them, and each process tunes its share alone, warm from the
   seeds (no per-key agreement: nobody else tunes it);
4. the processes exchange their results and each merges all of them in process order,
   so every process ends with the identical full result.

A process that never arrives makes the others raise `AgreementTimeoutError` naming it;
what they tuned themselves is in their caches already.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kerneltune._src.caching.result import AutotuningResult, Entry
from kerneltune._src.core import devices, files
from kerneltune._src.core.coordination import Peers, exchange_round, timeout_seconds
from kerneltune._src.kernel import hooks
from kerneltune._src.kernel.recording import Record
from kerneltune._src.selection.chain import ConfigSelectorChain
from kerneltune._src.workflows.tune_workers import deal_by_cost, estimated_cost

logger = logging.getLogger("kerneltune")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What this process tunes.

    Attributes:
      seeds: the keys every process tunes together, in the same order everywhere.
      share: the keys this process tunes alone.
    """

    seeds: list[Record]
    share: list[Record]


def family_of(record: Record) -> str:
    """The record's family: its op and, where its shapes are known, what is left of
    its key without sizes (`call_shapes`)."""
    shape = record.shape
    return f"{record.op_id_v} {shape.family if shape is not None else record.call_key}"


def seeds_of(records: Sequence[Record]) -> list[Record]:
    """The costliest record (ties: the smallest key) of each family of two or more
    keys, in key order."""
    best: dict[str, Record] = {}
    keys: dict[str, set[tuple[str, str]]] = {}
    for r in records:
        f = family_of(r)
        keys.setdefault(f, set()).add(r.key)
        if f not in best or (-estimated_cost(r), r.key) < (-estimated_cost(best[f]), best[f].key):
            best[f] = r
    return sorted((r for f, r in best.items() if len(keys[f]) > 1), key=lambda r: r.key)


def _deal(records: Sequence[Record], count: int) -> tuple[list[Record], list[list[Record]]]:
    """The seeds of `records` (every process holding all of them), and each of `count`
    processes' share of the rest."""
    seeds = seeds_of(records)
    seeded = {r.key for r in seeds}
    return seeds, deal_by_cost([r for r in records if r.key not in seeded], count)


def plans_for(records: Sequence[Record], count: int) -> list[Plan]:
    """Every process's plan, in process order, for a job of `count` processes that all
    hold `records` (`kerneltune tune --workers`: the parent knows what each worker will
    tune without asking them). `plan` gives the same, each process its own."""
    seeds, shares = _deal(records, count)
    return [Plan(seeds, sorted(share, key=lambda r: r.key)) for share in shares]


def plan(records: Sequence[Record], peers: Peers, *, timeout_s: float | None = None) -> Plan:
    """The seeds every process tunes together and this process's share of the rest."""
    mine = sorted({r.key for r in records})
    raw = exchange_round(
        peers,
        "split-keys",
        value=json.dumps(mine),
        timeout_s=timeout_seconds(timeout_s),
        what="the keys to split for offline tuning",
    )
    holders: dict[tuple[str, str], list[int]] = {}
    for pid, text in sorted(raw.items()):
        for op_id_v, call_key in files.loads(text):
            holders.setdefault((str(op_id_v), str(call_key)), []).append(pid)
    everyone = [r for r in records if len(holders.get(r.key, ())) == peers.num_processes]
    seeds, shares = _deal(everyone, peers.num_processes)
    share = shares[peers.process_id]
    some = [
        r
        for r in records
        if len(holders.get(r.key, ())) < peers.num_processes
        and min(holders.get(r.key, [peers.process_id])) == peers.process_id
    ]
    return Plan(seeds, sorted(share + some, key=lambda r: r.key))


def merge_results(
    peers: Peers,
    mine: AutotuningResult,
    cfg_types: Mapping[str, type],
    *,
    timeout_s: float | None = None,
) -> AutotuningResult:
    """Every process's result, merged in process order, on this device.

    Configs are rebuilt as `cfg_types` (the records' config classes), so every process
    holds the same, typed result."""
    raw = exchange_round(
        peers,
        "split-results",
        value=mine.dumps(),
        timeout_s=timeout_seconds(timeout_s),
        what="the results of offline tuning",
    )
    here = devices.device_fingerprint()
    entries: dict[tuple[str, str], Any] = {}
    others = set()
    for _, text in sorted(raw.items()):
        result = AutotuningResult.loads(text, cfg_types)
        if result.device != here:
            others.add(result.device)
        entries.update({(e.op_id_v, e.call_key): e for e in result})
    if others:
        logger.warning(
            "kerneltune: offline tuning adopted configs tuned on other devices (%s): every "
            "process of a job runs one program, so they share configs",
            ", ".join(sorted(others)),
        )
    return AutotuningResult(here, tuple(entries[k] for k in sorted(entries)))


def config_types(records: Sequence[Record]) -> dict[str, type]:
    """`{op_id_v: config class}` of the records' kernels that can be rebuilt here."""
    types: dict[str, type] = {}
    for record in records:
        try:
            kernel = record.get_kernel()
            cfg_type = hooks.config_type_of(kernel, record.invocation(kernel))
        except Exception:  # a kernel not defined here: its configs stay field dicts
            continue
        if cfg_type is not None:
            types[record.op_id_v] = cfg_type
    return types


def adopt(chain: ConfigSelectorChain[Any, Any], device: str, entry: Entry) -> None:
    """Puts a config another process tuned into `chain`'s caches."""
    if isinstance(entry.cfg, dict):
        return  # its kernel's config class is not known here: `with result:` applies it
    chain.store((device, entry.op_id_v, entry.call_key), entry.cfg, signature=entry.signature)
