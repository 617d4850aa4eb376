"""Configs stored before a field rename still inform a prediction: the H200 table
held 15 of its 22 matmul keys under the old names (`bm`/`bn`/`bk`), which matched no
candidate of today's `MatmulConfig`, so a new matmul shape near them was predicted as
if nothing had been timed (and its first call timed a shortlist)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import kerneltune as kt
from kerneltune._src.caching import shipped, storage
from kerneltune._src.caching.tuned_neighbours import timed_calls
from kerneltune._src.core.call_shapes import CallShape
from kerneltune._src.selection import prediction

H200 = "NVIDIA H200|cuda 13000"


@dataclasses.dataclass(frozen=True)
class TileConfig:
    block_m: int = 64
    renamed_fields: ClassVar[dict[str, str]] = {"bm": "block_m"}


def old_entry(sizes: tuple[int, ...], times: dict[int, float]) -> kt.CacheEntry:
    best = min(times, key=times.__getitem__)
    return kt.CacheEntry(
        "op@v1",
        f"key-{sizes}",
        {"bm": best},
        dev=H200,
        provenance="shipped",
        shape=CallShape("fam", sizes),
        timings=[{"cfg": {"bm": m}, "status": "ok", "time_s": t} for m, t in times.items()],
    )


def test_stored_old_names_are_read_under_the_names_of_now(tmp_path):
    path = tmp_path / "t.json"
    entries = [
        old_entry((1024, 1024), {64: 2e-3, 128: 1e-3}),
        old_entry((4096, 1024), {64: 3e-3, 128: 1e-3}),
    ]
    storage.write_export_file(str(path), [e.to_document() for e in entries], exported=0.0)
    tables = shipped.ShippedTables([path])
    shape = CallShape("fam", (2048, 1024))
    candidates = [TileConfig(block_m=64), TileConfig(block_m=128)]

    calls = timed_calls(shape, H200, "op@v1", TileConfig, shipped=tables)
    assert sorted(c.winner["block_m"] for c in calls) == [128, 128]
    assert all("bm" not in cfg for c in calls for cfg, _ in c.outcomes)
    pred = prediction.predict(shape.sizes, candidates, TileConfig(block_m=64), calls)
    assert pred.informed
    assert pred.best == TileConfig(block_m=128)
    assert pred.slowdowns[0] is not None and pred.slowdowns[0] < prediction.PRIOR_SLOWDOWN

    # Without the type the old names match nothing: the heuristic, uninformed (the bug).
    blind = timed_calls(shape, H200, "op@v1", shipped=tables)
    assert not prediction.predict(shape.sizes, candidates, TileConfig(block_m=64), blind).informed
