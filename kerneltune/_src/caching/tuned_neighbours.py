"""Where a warm start and a prediction come from: tuned calls near a new one.

When a key misses every cache, the calls of the same op, dtypes and static values
tuned at other sizes (in this process, in the persistent cache, in the shipped tables)
say where the new call's best config probably is. `hints` returns the winners of the
nearest calls (`call_shapes.distance`), nearest first, then the nearest call's best
configs in other regions of the space (say, its fastest config of another backend):
the best config of a new size is sometimes the runner-up of the last one. The tuner
starts its search there (`tuning/warm_start.py`). `timed_calls` returns the same
neighbours with every candidate's outcome, from which the selection layer predicts a
config before anything is timed (`selection/prediction.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kerneltune._src.caching.cache_entry import CacheEntry
from kerneltune._src.caching.shipped import ShippedTables, device_kind_of
from kerneltune._src.core import call_shapes
from kerneltune._src.core.call_shapes import CallShape
from kerneltune._src.core.configs import config_from_dict, current_names
from kerneltune._src.tuning import config_space

logger = logging.getLogger("kerneltune")

#: How many neighbours' winners a warm start gets.
MAX_NEIGHBOURS = 4
#: How many of the nearest neighbour's best configs, in distinct regions, it gets.
MAX_REGIONS = 3
#: A runner-up this many times slower than the fastest config is no hint. Backends
#: trade places at nearby sizes by tens of percent (a Pallas attention 27% behind cuDNN
#: at one shape on an H100 wins by 9% at the next), never by this much: a Pallas norm's
#: training step 4.7-12.6x behind XLA's on an H200, XLA's attention 16x behind cuDNN's.
FAR_BEHIND = 2.0

Ranked = tuple[Any, ...]  # a call's best configs, in distinct regions, the winner first


def ranked(timings: Iterable[tuple[Any, float | None]], winner: Any = None) -> Ranked:
    """The best config of each region of a tuned space, fastest first, `winner` (the
    config the call uses) first: each next one at least two fields away from every one
    picked before it, and at most one of each backend that is not the winner's, up to
    `MAX_REGIONS`.

    A backend that lost is worth one try at a new size, not several: on an H100 each
    Mosaic runner-up cost an off-table matmul key 0.6-0.9 s of lowering and compiling,
    and none of them won over cuBLAS. A runner-up `FAR_BEHIND` the fastest is worth
    none (a Pallas norm's forward + backward cost an off-table key about 1 s on an
    H200, 4.7x behind XLA's)."""
    ok = sorted(
        ((t, i, c) for i, (c, t) in enumerate(timings) if t is not None), key=lambda x: x[:2]
    )
    picked: list[Any] = [] if winner is None else [winner]
    points = [config_space.config_point(p) for p in picked]
    losing_backends: set[Any] = set()  # of the runner-ups, other than the winner's
    for t, _, cfg in ok:
        if t > FAR_BEHIND * ok[0][0]:
            break  # sorted: every later one is as far behind
        point = config_space.config_point(cfg)
        if any(config_space.distance(point, p) < 2 for p in points):
            continue
        backend = backend_of(cfg)
        if picked and backend != backend_of(picked[0]):
            if backend in losing_backends:
                continue
            losing_backends.add(backend)
        picked.append(cfg)
        points.append(point)
        if len(picked) == MAX_REGIONS:
            break
    return tuple(picked)


Ratios = dict[Any, float]  # a tuned call's backends: each one's fastest over the fastest


def backend_ratios(timings: Iterable[tuple[Any, float | None]]) -> Ratios:
    """Each backend's fastest time over the fastest of all (1.0: the winner's backend);
    configs without a backend count as one backend (None)."""
    best: dict[Any, float] = {}
    for cfg, t in timings:
        if t is not None:
            b = backend_of(cfg)
            best[b] = min(t, best.get(b, t))
    fastest = min(best.values(), default=0.0)
    return {b: t / fastest for b, t in best.items()} if fastest > 0 else {}


def nearest_ratios(shape: CallShape | None, entries: Iterable[CacheEntry]) -> Ratios:
    """The backend ratios of the nearest of `entries` in `shape`'s family that timed
    any config ({} when there is none)."""
    if shape is None:
        return {}
    tuned = [(at, backend_ratios(t)) for at, _, t in _in_family(shape, entries)]
    found = call_shapes.nearest(shape, [(s, r) for s, r in tuned if r], 1)
    return found[0][1] if found else {}


def backend_of(cfg: Any) -> Any:
    """A config's backend (a stored config is a field dict), None where it has none."""
    return dict(config_space.config_point(cfg)).get("backend")


Outcomes = tuple[tuple[Any, "float | None"], ...]  # (config, median seconds; None: failed)


@dataclasses.dataclass(frozen=True)
class TimedCall:
    """A tuned call: its shape, the config it uses, and every measured candidate's
    outcome (none when only the winner is known, as in a hand-written entry).

    Attributes:
      shape: the call's sizes and family.
      winner: the config the call uses (a config, or its fields as read from a file).
      outcomes: (config, median seconds) per candidate measured; None where it failed.
      borrowed_from: the GPU model whose shipped table it comes from, where that is
        not the call's own ("" for the call's own GPU model).
    """

    shape: CallShape
    winner: Any
    outcomes: Outcomes = ()
    borrowed_from: str = ""


class LocalIndex:
    """The shapes, best configs and outcomes of the calls tuned (or adopted) in this
    process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tuned: dict[tuple[str, str], dict[CallShape, Ranked]] = {}
        self._timed: dict[tuple[str, str], dict[CallShape, TimedCall]] = {}

    def add(
        self,
        dev: str,
        op_id_v: str,
        shape: CallShape | None,
        best: Ranked,
        outcomes: Outcomes = (),
    ) -> None:
        if shape is None or not best:
            return
        with self._lock:
            self._tuned.setdefault((dev, op_id_v), {})[shape] = best
            self._timed.setdefault((dev, op_id_v), {})[shape] = TimedCall(
                shape, best[0], tuple(outcomes)
            )

    def of(self, dev: str, op_id_v: str) -> list[tuple[CallShape, Ranked]]:
        with self._lock:
            return list(self._tuned.get((dev, op_id_v), {}).items())

    def timed(self, dev: str, op_id_v: str) -> list[TimedCall]:
        with self._lock:
            return list(self._timed.get((dev, op_id_v), {}).values())


def outcomes_of(timings: Iterable[Mapping[str, Any]]) -> Outcomes:
    """The outcomes stored in an entry's candidate timings: the measured ones with their
    time, the failed ones with None; those a search skipped ("pruned") are left out."""
    out: list[tuple[Any, float | None]] = []
    for c in timings:
        status, t = c.get("status"), c.get("time_s")
        if status == "ok" and isinstance(t, (int, float)) and t > 0:
            out.append((c.get("cfg"), float(t)))
        elif status not in ("ok", "pruned", None):
            out.append((c.get("cfg"), None))
    return tuple(out)


def timed_calls(
    shape: CallShape | None,
    dev: str,
    op_id_v: str,
    cfg_type: type[Any] | None = None,
    *,
    local: LocalIndex | None = None,
    persistent: Any = None,
    shipped: Any = None,
) -> list[TimedCall]:
    """The tuned calls in `shape`'s family known here: this process's, the persistent
    cache's (of this device, read-only layers included), then the shipped tables' (of
    this device kind); one per size, from the first of those that has it. Where none
    of those holds a call of the family, the shipped tables of the other GPU models of
    this architecture (`shipped.ARCHITECTURES`): a Hopper GPU with no table of its own
    for an op predicts from another Hopper's. [] when the call has no shape. A cache
    that cannot be read adds nothing (a prediction is an optimisation).

    A stored config is a field dict under the names of when it was stored; with
    `cfg_type`, each one's fields are renamed to `cfg_type`'s names now
    (`renamed_fields`), so that it matches the candidates it predicts. (Without that,
    the H200 table's 15 matmul keys stored as `bm`/`bn`/`bk` informed no prediction.)"""
    if shape is None:
        return []
    found: dict[tuple[int, ...], TimedCall] = {}

    def add(calls: Iterable[TimedCall]) -> None:
        for call in calls:
            same = call.shape.family == shape.family and len(call.shape.sizes) == len(shape.sizes)
            if same:
                found.setdefault(call.shape.sizes, call)

    if local is not None:
        add(local.timed(dev, op_id_v))
    if persistent is not None:
        try:
            stored = persistent.entries(readonly_layers=True, op_id=op_id_v)
            add(_timed_entries((e for e in stored if e.dev == dev), cfg_type))
        except Exception as e:
            logger.warning("kerneltune: no prediction from the persistent cache: %s", e)
    if shipped is not None:
        add(_timed_entries(shipped.entries_of(dev, op_id_v), cfg_type))
        if not found and isinstance(shipped, ShippedTables):
            add(_timed_entries(shipped.sibling_entries_of(dev, op_id_v), cfg_type, borrowed=True))
    return list(found.values())


def _timed_entries(
    entries: Iterable[CacheEntry], cfg_type: type[Any] | None, borrowed: bool = False
) -> Iterator[TimedCall]:
    for e in entries:
        if e.shape is not None:
            kind = device_kind_of(e.dev) if borrowed else ""
            outcomes = tuple((current_names(c, cfg_type), t) for c, t in outcomes_of(e.timings))
            winner = current_names(e.cfg, cfg_type)
            yield TimedCall(e.shape, winner, outcomes, borrowed_from=kind)


def hints(
    shape: CallShape | None,
    dev: str,
    op_id_v: str,
    cfg_type: type[Any] | None,
    *,
    local: LocalIndex | None = None,
    persistent: Any = None,
    shipped: Any = None,
) -> list[Any]:
    """Configs to start tuning a call of `shape` from: the winners of the
    `MAX_NEIGHBOURS` nearest tuned calls in its family, nearest first, then the nearest
    call's best configs in other regions; each once, as `cfg_type` instances. Where
    this GPU model knows no tuned call of the op, another GPU model's table of its
    architecture stands in (as in `timed_calls`). [] when the call has no shape or no
    neighbour is known. A cache that cannot be read gives no hints (a warm start is an
    optimisation)."""
    if shape is None:
        return []
    tuned: list[tuple[CallShape, Ranked]] = []
    if local is not None:
        tuned += local.of(dev, op_id_v)
    if persistent is not None:
        try:
            stored = persistent.entries(readonly_layers=True, op_id=op_id_v)
            tuned += _from_entries(shape, (e for e in stored if e.dev == dev))
        except Exception as e:
            logger.warning("kerneltune: no warm start from the persistent cache: %s", e)
    if shipped is not None:
        tuned += _from_entries(shape, shipped.entries_of(dev, op_id_v))
        own = any(at.family == shape.family for at, _ in tuned)
        if not own and isinstance(shipped, ShippedTables):
            tuned += _from_entries(shape, shipped.sibling_entries_of(dev, op_id_v))
    return [
        c for c in (_typed(c, cfg_type) for c in nearest_configs(shape, tuned)) if c is not None
    ]


def nearest_configs(shape: CallShape, tuned: Iterable[tuple[CallShape, Ranked]]) -> list[Any]:
    """The hints for `shape` from tuned calls (their shapes and ranked best configs):
    the winners of the `MAX_NEIGHBOURS` nearest, nearest first, then the nearest one's
    best configs in other regions; each config once."""
    near = [best for _, best in call_shapes.nearest(shape, tuned, MAX_NEIGHBOURS)]
    if not near:
        return []
    return _unique([best[0] for best in near] + list(near[0][1:]))


def _from_entries(
    shape: CallShape, entries: Iterable[CacheEntry]
) -> list[tuple[CallShape, Ranked]]:
    """The shapes and ranked best configs of the entries in `shape`'s family (the
    others are not ranked: a cache holds many)."""
    return [(at, ranked(t, e.cfg)) for at, e, t in _in_family(shape, entries)]


def _in_family(
    shape: CallShape, entries: Iterable[CacheEntry]
) -> Iterator[tuple[CallShape, CacheEntry, list[tuple[Any, float | None]]]]:
    """The entries in `shape`'s family: each one's shape, the entry, and its timed
    configs with their times."""
    for e in entries:
        if e.shape is not None and e.shape.family == shape.family:
            timings = [
                (c.get("cfg"), c.get("time_s")) for c in e.timings if c.get("status") == "ok"
            ]
            yield e.shape, e, timings


def _typed(cfg: Any, cfg_type: type[Any] | None) -> Any:
    """`cfg` as a `cfg_type` (stored configs are field dicts), or None when it no
    longer fits the type."""
    if cfg_type is None or isinstance(cfg, cfg_type):
        return cfg
    try:
        return config_from_dict(cfg, cfg_type)
    except Exception:
        return None


def _unique(configs: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for c in configs:
        if all(c != o for o in out):
            out.append(c)
    return out
