"""Replays warm starts over exhaustive timings recorded on a GPU, on any machine.

A shipped table (`tools/ship_tables.py`) records every candidate's time for each
shape of a grid. For each shape, held out in turn, the replay warm-starts a search
from the winners of the other shapes of its family (the nearest first, as the tuner
does), answering each evaluation with the recorded time times a random measurement
error, and reports the *regret* (the recorded time of the config it would pick over the
best recorded time) and the fraction of the space it evaluated. Exhaustive search and
the cold budgeted search (coordinate descent) run on the same replay, as baselines.
`batches` counts the evaluations that built new configs: each is a compile latency on
a GPU (the replay's evaluator compiles 16 at once, as a 16-core GPU host does;
`--compiles-at-once 1` replays a space of Mosaic GPU kernels, which a process compiles
one at a time).

    python -m benchmarks.warm_replay [TABLE] [--seeds 10] [--noise 0.01] [--compiles-at-once 16]

`--space triton` (or `pallas`) replays the configs of that backend only: a space
without a library backend that wins everywhere, as a user's own Pallas kernel has.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from kerneltune._src.caching import storage, tuned_neighbours
from kerneltune._src.caching.cache_entry import CacheEntry, entry_from_document
from kerneltune._src.caching.shipped import PACKAGE_TABLES
from kerneltune._src.tuning import search, warm_start

DEFAULT_TABLE = str(PACKAGE_TABLES / "nvidia-h100-80gb-hbm3.json")


@dataclasses.dataclass(frozen=True)
class ReplayOutcome:
    op: str
    signature: str
    method: str
    seed: int
    regret: float  # recorded time of the pick over the best recorded time, minus 1
    evaluated: float  # fraction of the space
    batches: int  # evaluations that built new configs: each a compile latency on a GPU


class ReplayEvaluator:
    """Answers a search with recorded times times a random error (failed: None)."""

    def __init__(
        self,
        cfgs: list[Any],
        times: list[float | None],
        reference: int | None,
        *,
        noise: float,
        seed: int,
        workers: int = 16,
    ):
        self.candidates = cfgs
        self.reference_index = reference
        self.workers = workers
        self.times, self.noise = times, noise
        self.rng = random.Random(seed)
        self.measured: dict[int, float | None] = {}
        self.batches = 0

    def evaluate(
        self, indices: Sequence[int], rounds: int | None = None
    ) -> dict[int, float | None]:
        self.batches += any(i not in self.measured for i in indices)
        for i in indices:
            if i not in self.measured:
                t = self.times[i]
                self.measured[i] = None if t is None else t * (1 + self.rng.gauss(0, self.noise))
        return {i: self.measured[i] for i in indices}

    def exhausted(self) -> bool:
        return False

    def pick(self) -> int:
        ok = [i for i, t in self.measured.items() if t is not None]
        return min(ok, key=lambda i: self.measured[i])  # type: ignore[arg-type, return-value]


def space_of(entry: CacheEntry, backend: str | None) -> tuple[list[Any], list[float | None]]:
    """The recorded candidates (their fields) and times; with `backend`, those of that
    backend only."""
    cfgs, times = [], []
    for c in entry.timings:
        cfg = c["cfg"]
        if backend is not None and (not isinstance(cfg, dict) or cfg.get("backend") != backend):
            continue
        cfgs.append(cfg)
        times.append(c.get("time_s") if c.get("status") == "ok" else None)
    return cfgs, times


def replay_shape(
    entry: CacheEntry,
    others: Sequence[CacheEntry],
    *,
    backend: str | None,
    seeds: Iterable[int],
    noise: float,
    workers: int = 16,
) -> list[ReplayOutcome]:
    cfgs, times = space_of(entry, backend)
    ok = [t for t in times if t is not None]
    if len(cfgs) < warm_start.WARM_MIN_SPACE or not ok:
        return []
    best = min(ok)
    # What the tuner would get from the other shapes' entries, within this space.
    tuned = []
    for o in others:
        o_cfgs, o_times = space_of(o, backend)
        if o.shape is not None and any(t is not None for t in o_times):
            tuned.append((o.shape, tuned_neighbours.ranked(zip(o_cfgs, o_times))))
    hints = tuned_neighbours.nearest_configs(entry.shape, tuned)  # type: ignore[arg-type]
    reference = cfgs.index(entry.heuristic_cfg) if entry.heuristic_cfg in cfgs else 0
    out = []
    for seed in seeds:
        methods: list[tuple[str, search.SearchStrategy]] = [
            ("warm start", warm_start.strategy_for("auto", cfgs, hints, None)),
            ("cold budgeted", search.CoordinateDescent(seed=seed)),
            ("exhaustive", search.Exhaustive()),
        ]
        for name, strategy in methods:
            ev = ReplayEvaluator(cfgs, times, reference, noise=noise, seed=seed, workers=workers)
            strategy.search(ev)
            regret = times[ev.pick()] / best - 1  # type: ignore[operator]
            out.append(
                ReplayOutcome(
                    entry.op_id_v,
                    entry.signature,
                    name,
                    seed,
                    regret,
                    len(ev.measured) / len(cfgs),
                    ev.batches,
                )
            )
    return out


def replay(
    entries: Sequence[CacheEntry],
    *,
    backend: str | None = None,
    seeds: Iterable[int] = range(10),
    noise: float = 0.01,
    workers: int = 16,
) -> list[ReplayOutcome]:
    """Every shape of every family with at least 3 shapes, held out in turn."""
    families: dict[tuple[str, str], list[CacheEntry]] = {}
    for e in entries:
        if e.shape is not None:
            families.setdefault((e.op_id_v, e.shape.family), []).append(e)
    out: list[ReplayOutcome] = []
    for group in families.values():
        if len(group) < 3:
            continue
        for i, e in enumerate(group):
            out += replay_shape(
                e,
                group[:i] + group[i + 1 :],
                backend=backend,
                seeds=list(seeds),
                noise=noise,
                workers=workers,
            )
    return out


def load(path: str) -> list[CacheEntry]:
    return [
        entry_from_document(doc, f"{path}#{i}")
        for i, doc in enumerate(storage.read_export_file(path))
    ]


def summary(outcomes: Sequence[ReplayOutcome]) -> dict[tuple[str, str], dict[str, float]]:
    """Per op and method: median and worst regret, median evaluated fraction, shapes."""
    groups: dict[tuple[str, str], list[ReplayOutcome]] = {}
    for o in outcomes:
        groups.setdefault((o.op, o.method), []).append(o)
    return {
        key: {
            "median_regret": statistics.median(o.regret for o in g),
            "p90_regret": sorted(o.regret for o in g)[int(0.9 * (len(g) - 1))],
            "max_regret": max(o.regret for o in g),
            "median_evaluated": statistics.median(o.evaluated for o in g),
            "median_batches": statistics.median(o.batches for o in g),
            "max_batches": max(o.batches for o in g),
            "shapes": len({o.signature for o in g}),
        }
        for key, g in sorted(groups.items())
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "table", nargs="?", default=DEFAULT_TABLE, help="a table JSON file (default: the H100's)"
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=10,
        help="replays per shape and method (noise and search seeds)",
    )
    p.add_argument("--noise", type=float, default=0.01, help="relative measurement error (sd)")
    p.add_argument("--space", default=None, help="one backend's configs only (triton, pallas)")
    p.add_argument(
        "--compiles-at-once", type=int, default=16,
        help="configs that compile in the wall time of one (1: Mosaic GPU kernels)",
    )  # fmt: skip
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
    args = p.parse_args(argv)
    outcomes = replay(
        load(args.table),
        backend=args.space,
        seeds=range(args.seeds),
        noise=args.noise,
        workers=args.compiles_at_once,
    )
    rows = summary(outcomes)
    print(
        f"table {args.table}, space {args.space or 'all backends'}, {args.seeds} seeds, "
        f"noise {args.noise:.0%}, {args.compiles_at_once} compiles at once"
    )
    print(
        "| op | method | shapes | median regret | p90 regret | worst regret | median evaluated "
        "| batches: median (most) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (op, method), r in rows.items():
        print(
            f"| {op} | {method} | {r['shapes']} | {r['median_regret']:.2%} | {r['p90_regret']:.2%} | "
            f"{r['max_regret']:.2%} | {r['median_evaluated']:.0%} | "
            f"{r['median_batches']:g} ({r['max_batches']}) |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{op} {m}": r for (op, m), r in rows.items()}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
