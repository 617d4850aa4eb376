"""Leave-one-out regret of the config kerneltune predicts for a shape no table holds.

Each shipped table (`tools/ship_tables.py`) tuned every key exhaustively, so each
entry records the time of every candidate at its shape. Each key is held out in turn
and predicted from the other keys of its op and family in the same table, exactly as
the selection chain predicts a new call from its tuned neighbours
(`kerneltune/_src/selection/prediction.py`), over the held-out key's own candidates.
Because the held-out key's table entry times every candidate, each figure is a real
regret (the recorded time of the config chosen over the best recorded time, minus 1),
not an estimate:

- "predicted": the predicted config, used untimed;
- "first call": what the default policy's first call uses: the predicted config where
  timings of the neighbours informed it (`FirstCallBudget.trust_prediction`), else the
  fastest of the timed shortlist;
- "shortlist": the fastest (by the recorded times) of the heuristic and the 3
  candidates predicted fastest, which a first call times where it does not trust the
  prediction (`KERNELTUNE_FIRST_CALL_TRUST_PREDICTION=0`);
- "heuristic": the kernel's heuristic config (no tuning, no prediction).

The heuristic is the one the selection chain would use for the key today: the
kernel's `heuristic_cfg` (`hooks.find_heuristic`) for the call rebuilt from the key's
signature, as on the table's GPU model (`heuristic_now`), not the one recorded when the
table was tuned, which a later heuristic may have replaced (the softmax's fixed 4 warps,
the grouped matmul's 128x128 Mosaic tiles). A key whose call cannot be rebuilt keeps the
recorded one (`Outcome.recorded_heuristic`).

"slower than untuned" counts the keys where the first call's config is more than 2%
slower than the heuristic's (a step slower than no tuning at all).

A key whose family has no other key in the table ("alone") is predicted with no
neighbour, which gives the heuristic, and its first call times the configs nearest the
heuristic; such keys count in the figures like the others. The weights of
the prediction were chosen on this same replay (seven variants), so these figures are
optimistic by that much; `benchmarks/first_call_gpu.py` measures the regret at shapes
in no table.

    python -m benchmarks.prediction_regret [TABLE ...] [--shortlist 3] [--json out.json]

CPU only: it reads the tables and times nothing.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import re
import statistics
import sys
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

import jax

import kerneltune.kernels  # noqa: F401  (defines, so registers, the bundled kernels)
from kerneltune._src.caching import storage
from kerneltune._src.caching.cache_entry import CacheEntry, entry_from_document, plain
from kerneltune._src.caching.shipped import PACKAGE_TABLES, device_kind_of
from kerneltune._src.caching.tuned_neighbours import TimedCall, outcomes_of
from kerneltune._src.cli import explain_command
from kerneltune._src.core import devices, options
from kerneltune._src.core.configs import config_to_dict, current_names
from kerneltune._src.kernel import hooks
from kerneltune._src.kernel.base import make_invocation, registered_kernels
from kerneltune._src.selection import first_call, prediction
from kerneltune.kernels import _common

METHODS = ("predicted", "first call", "shortlist", "heuristic")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One held-out key.

    Attributes:
      table: the table's name.
      op: the op with its version.
      signature: the key's shapes.
      neighbours: how many other keys of its family informed the prediction.
      regret: per method, the recorded time of its config over the best, minus 1
        (None: that config failed at the key, or was not timed there).
      exact: the predicted config is the table's winner at the key.
      recorded_heuristic: the key's call could not be rebuilt, so its heuristic is the
        one recorded in the table, not the kernel's today.
    """

    table: str
    op: str
    signature: str
    neighbours: int
    regret: dict[str, float | None]
    exact: bool
    recorded_heuristic: bool = False


#: The config types, by op, whose fields were renamed after some table entries were
#: stored (the matmul's and GLU's `bm`/`bn`/`bk`): their entries are read under
#: today's names, as the selection chain reads them (`tuned_neighbours.timed_calls`),
#: so that a key of either naming informs a key of the other.
RENAMED = {
    k.op_id: k.config_type
    for k in registered_kernels().values()
    if getattr(getattr(k, "config_type", None), "renamed_fields", None)
}


def load(path: str) -> list[CacheEntry]:
    return [
        _current_names(entry_from_document(doc, f"{path}#{i}"))
        for i, doc in enumerate(storage.read_export_file(path))
    ]


def _current_names(e: CacheEntry) -> CacheEntry:
    cls = RENAMED.get(e.op_id_v.partition("@")[0])
    if cls is None:
        return e
    return dataclasses.replace(
        e,
        cfg=current_names(e.cfg, cls),
        heuristic_cfg=current_names(e.heuristic_cfg, cls),
        timings=tuple({**t, "cfg": current_names(t.get("cfg"), cls)} for t in e.timings),
    )


def _times(entry: CacheEntry) -> dict[str, float]:
    return {prediction.config_id(cfg): t for cfg, t in outcomes_of(entry.timings) if t is not None}


class _Text:
    """A static value a signature shows only by its repr (a function): kept as that
    text, which no heuristic reads."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _split(text: str) -> list[str]:
    """`text` split at its top-level commas."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([<{") - (ch in ")]>}")
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _value(text: str) -> Any:
    array = explain_command.parse_argument(text)  # `bf16[16384,1024]`, as `explain` reads it
    if isinstance(array, jax.ShapeDtypeStruct):
        return array
    if text.startswith("(") and text.endswith(")"):
        return tuple(_value(p) for p in _split(text[1:-1]))
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return _Text(text)


def rebuilt_call(signature: str) -> tuple[tuple[Any, ...], dict[str, Any], bool]:
    """The abstract arguments, static values and training flag of a key's call, from
    its signature (`keys.describe_abstract`: `bf16[16384,1024], eps=1e-06 (training)`)."""
    training = signature.endswith(" (training)")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for part in _split(signature.removesuffix(" (training)")):
        named = re.fullmatch(r"([A-Za-z_]\w*)=(.*)", part, re.DOTALL)
        if named:
            kwargs[named.group(1)] = _value(named.group(2))
        else:
            args.append(_value(part))
    return tuple(args), kwargs, training


class _Device:
    """A stand-in for JAX's default device: a GPU of the table's model."""

    platform = "gpu"

    def __init__(self, kind: str) -> None:
        self.device_kind = kind


def _device_caches() -> tuple[Any, ...]:
    return (
        devices._default_device_kind,
        devices.device_fingerprint,
        _common.shared_memory_limit,
    )


@contextlib.contextmanager
def on_gpu(kind: str) -> Iterator[None]:
    """Kernel hooks called inside see JAX's default device as a GPU of `kind` (the
    table's model), as where the table was tuned; what they cached of this device is
    forgotten before and after."""
    for cached in _device_caches():
        cached.cache_clear()
    try:
        with (
            mock.patch.object(jax, "devices", lambda *_: [_Device(kind)]),
            options.PLATFORM.override("triton"),
        ):
            yield
    finally:
        for cached in _device_caches():
            cached.cache_clear()


def kernel_of(entry: CacheEntry) -> Any:
    """An instance of the bundled kernel of `entry`'s op and version, or None."""
    found = [
        cls
        for cls in registered_kernels().values()
        if cls.op_id and f"{cls.op_id}@v{cls.version}" == entry.op_id_v
    ]
    return found[0]() if len(found) == 1 else None


def heuristic_now(entry: CacheEntry) -> Any:
    """The heuristic the selection chain uses for `entry`'s call today (its fields), as
    on the table's GPU model: the kernel's `heuristic_cfg` for the call rebuilt from the
    signature. None where the op's kernel is not defined here or the call cannot be
    rebuilt (its signature cut a long value short)."""
    kernel = kernel_of(entry)
    if kernel is None:
        return None
    try:
        args, kwargs, training = rebuilt_call(entry.signature)
        inv = make_invocation(kernel, args, kwargs, differentiated=True if training else None)
        if inv.signature != entry.signature:
            return None
        with on_gpu(device_kind_of(entry.dev)):
            cfg = hooks.find_heuristic(kernel, inv)
    except Exception:
        return None
    return None if cfg is None else plain(config_to_dict(cfg))


def held_out(
    entry: CacheEntry,
    others: Sequence[CacheEntry],
    table: str,
    shortlist: int,
    heuristic: Any = None,
) -> Outcome:
    """Predicts `entry`'s key from `others` (its family's other keys) and scores it.
    `heuristic`: the kernel's heuristic for the key (`heuristic_now`); None: the one the
    table recorded."""
    calls = [TimedCall(o.shape, o.cfg, outcomes_of(o.timings)) for o in others if o.shape]
    candidates = [c["cfg"] for c in entry.timings]
    kernel = kernel_of(entry)
    recorded = heuristic is None
    if recorded:
        heuristic = entry.heuristic_cfg if isinstance(entry.heuristic_cfg, dict) else None
    assert entry.shape is not None
    pred = prediction.predict(
        entry.shape.sizes,
        candidates,
        heuristic,
        calls,
        **({} if kernel is None else first_call.size_models(kernel)),
    )
    times = _times(entry)
    best = min(times.values())

    def regret(cfg: Any) -> float | None:
        t = times.get(prediction.config_id(cfg))
        return None if t is None else t / best - 1

    timed = [r for r in map(regret, pred.shortlist(shortlist)) if r is not None]
    short = min(timed) if timed else None
    return Outcome(
        table=table,
        op=entry.op_id_v,
        signature=entry.signature,
        neighbours=len(pred.neighbours),
        regret={
            "predicted": regret(pred.best),
            "first call": regret(pred.best) if pred.informed else short,
            "shortlist": short,
            "heuristic": None if heuristic is None else regret(heuristic),
        },
        exact=prediction.config_id(pred.best) == prediction.config_id(entry.cfg),
        recorded_heuristic=recorded,
    )


def replay(entries: Sequence[CacheEntry], table: str, shortlist: int = 3) -> list[Outcome]:
    """Every key of the table held out in turn, with the kernel's heuristic today."""
    out = []
    for i, e in enumerate(entries):
        if e.shape is None or not _times(e):
            continue
        family = [
            o
            for j, o in enumerate(entries)
            if j != i and o.op_id_v == e.op_id_v and o.shape and o.shape.family == e.shape.family
        ]
        out.append(held_out(e, family, table, shortlist, heuristic_now(e)))
    return out


def summary(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Per table and op: keys (and how many had no neighbour), exact matches with the
    table's winner, and per method the median and worst regret and how often its config
    failed at the key (a failure is not in the median; it is the worst)."""
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault((o.table, o.op), []).append(o)
    rows = []
    for (table, op), group in sorted(groups.items()):
        row: dict[str, Any] = {
            "table": table,
            "op": op,
            "keys": len(group),
            "alone": sum(not o.neighbours for o in group),
            "exact": sum(o.exact for o in group) / len(group),
            "slower": sum(_slower_than_untuned(o) for o in group),
        }
        for m in METHODS:
            known = [o.regret[m] for o in group if o.regret[m] is not None]
            failed = sum(o.regret[m] is None for o in group)
            row[m] = {
                "median": statistics.median(known) if known else None,
                "worst": float("inf") if failed else max(known, default=None),
                "failed": failed,
            }
        rows.append(row)
    return rows


def _slower_than_untuned(o: Outcome) -> bool:
    first, untuned = o.regret["first call"], o.regret["heuristic"]
    if untuned is None:
        return False
    return first is None or (1 + first) > (1 + untuned) * 1.02


def _pct(x: float | None) -> str:
    if x == float("inf"):
        return "failed"
    return "-" if x is None else f"{x:.1%}"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| table | op | keys (alone) | exact | predicted: median / worst | first call: "
        "median / worst | shortlist: median / worst | heuristic: median / worst | "
        "slower than untuned |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    lines = [head]
    for r in rows:
        cells = [f"{_pct(r[m]['median'])} / {_pct(r[m]['worst'])}" for m in METHODS]
        failed = sum(r[m]["failed"] for m in METHODS)
        note = f" ({failed} failed)" if failed else ""
        lines.append(
            f"| {r['table']} | {r['op']} | {r['keys']} ({r['alone']}) | {_pct(r['exact'])} | "
            + " | ".join(cells)
            + f" | {r['slower']} |{note}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = [str(t) for t in sorted(PACKAGE_TABLES.glob("*.json"))]
    p.add_argument(
        "tables", nargs="*", default=default, help="table JSON files (default: the shipped ones)"
    )
    p.add_argument("--shortlist", type=int, default=3, help="candidates a first call times")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
    args = p.parse_args(argv)
    outcomes: list[Outcome] = []
    for path in args.tables:
        name = path.rsplit("/", 1)[-1].removesuffix(".json")
        outcomes += replay(load(path), name, args.shortlist)
    rows = summary(outcomes)
    print(
        "Leave-one-out over the shipped tables: every candidate of every key is timed in "
        "the table, so these regrets are exact. 'alone': keys whose family has no other "
        "key (predicted with no neighbour: the heuristic)."
    )
    print(markdown(rows))
    recorded = [f"{o.table} {o.op} {o.signature}" for o in outcomes if o.recorded_heuristic]
    if recorded:
        print(f"\nHeuristic as recorded in the table (call not rebuilt): {'; '.join(recorded)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"rows": rows, "keys": [dataclasses.asdict(o) for o in outcomes]}, f, indent=1
            )


if __name__ == "__main__":
    sys.exit(main())
