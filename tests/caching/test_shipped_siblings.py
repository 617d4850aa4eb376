"""Another GPU model's table of the same architecture informs a prediction where the
call's own GPU model has no tuned call of its family (`shipped.ARCHITECTURES`)."""

from __future__ import annotations

import pytest

import kerneltune as kt
from kerneltune._src.caching import shipped, storage
from kerneltune._src.caching.tuned_neighbours import timed_calls
from kerneltune._src.core.call_shapes import CallShape

H100 = "NVIDIA H100 80GB HBM3|cuda 12080"
H200 = "NVIDIA H200|cuda 13000"
GH200 = "NVIDIA GH200 480GB|cuda 12080"
A100 = "NVIDIA A100-SXM4-80GB|cuda 12080"
SHAPE = CallShape("fam", (256, 256))


@pytest.mark.parametrize(
    ("kind", "arch"),
    [
        ("NVIDIA H100 80GB HBM3", "hopper"),
        ("NVIDIA H100 PCIe", "hopper"),
        ("NVIDIA H200", "hopper"),
        ("NVIDIA H20", "hopper"),
        ("NVIDIA GH200 480GB", "hopper"),
        ("NVIDIA A100-SXM4-80GB", None),
        ("NVIDIA B200", None),
        ("cpu", None),
    ],
)
def test_a_device_kind_is_placed_by_a_whole_word_of_its_name(kind, arch):
    assert shipped.architecture_of(kind) == arch


def entry(dev: str, sizes: tuple[int, ...], best: str, key: str = "") -> kt.CacheEntry:
    timings = [
        {"cfg": {"tile": t}, "status": "ok", "time_s": 1e-3 if t == best else 2e-3}
        for t in ("small", "large")
    ]
    return kt.CacheEntry(
        "op@v1",
        key or f"{dev}-{sizes}",
        {"tile": best},
        dev=dev,
        provenance="shipped",
        shape=CallShape("fam", sizes),
        timings=timings,
    )


def table(tmp_path, *entries: kt.CacheEntry) -> shipped.ShippedTables:
    path = tmp_path / "t.json"
    storage.write_export_file(str(path), [e.to_document() for e in entries], exported=0.0)
    return shipped.ShippedTables([path])


def winners(calls) -> list[tuple[tuple[int, ...], str]]:
    return sorted((c.shape.sizes, c.winner["tile"]) for c in calls)


def test_an_h100_with_no_table_of_its_own_predicts_from_the_h200s(tmp_path):
    tables = table(tmp_path, entry(H200, (256, 256), "large"), entry(H200, (512, 256), "small"))
    calls = timed_calls(SHAPE, H100, "op@v1", shipped=tables)
    assert winners(calls) == [((256, 256), "large"), ((512, 256), "small")]
    assert [o for c in calls for o in c.outcomes]  # with every candidate's time
    # Another Hopper too; but not a GPU of another architecture, nor another op.
    assert winners(timed_calls(SHAPE, GH200, "op@v1", shipped=tables)) == winners(calls)
    assert timed_calls(SHAPE, A100, "op@v1", shipped=tables) == []
    assert timed_calls(SHAPE, H100, "other@v1", shipped=tables) == []


def test_the_gpus_own_tuned_calls_of_the_family_leave_the_siblings_out(tmp_path):
    # The replay over the tables (BENCHMARKS.md) measured a sibling's table alone, as a
    # fallback: mixed with the GPU's own keys its sizes would crowd out nearer own ones.
    tables = table(tmp_path, entry(H200, (256, 256), "large"), entry(H100, (1024, 256), "small"))
    assert winners(timed_calls(SHAPE, H100, "op@v1", shipped=tables)) == [((1024, 256), "small")]


def test_siblings_come_in_an_order_fixed_by_the_models_names(tmp_path):
    # Every process of a job must predict the same config: the same table gives the
    # same calls in the same order, whichever file lists its entries first.
    a = [entry(GH200, (256, 256), "small"), entry(H200, (256, 256), "large")]
    first = timed_calls(SHAPE, H100, "op@v1", shipped=table(tmp_path, *a))
    second = timed_calls(SHAPE, H100, "op@v1", shipped=table(tmp_path, *reversed(a)))
    assert winners(first) == winners(second) == [((256, 256), "small")]  # GH200 < H200


def test_a_prediction_from_another_gpus_table_says_so(tmp_path):
    from kerneltune._src.selection import prediction

    tables = table(tmp_path, entry(H200, (256, 256), "large"))
    calls = timed_calls(SHAPE, H100, "op@v1", shipped=tables)
    p = prediction.predict(SHAPE.sizes, [{"tile": "small"}, {"tile": "large"}], None, calls)
    assert p.best == {"tile": "large"} and p.borrowed_from == ("NVIDIA H200",)
    assert "tuned call(s) on NVIDIA H200 nearest in size (256x256)" in p.describe()
    own = table(tmp_path, entry(H100, (256, 256), "large"))
    mine = prediction.predict(SHAPE.sizes, [{"tile": "small"}, {"tile": "large"}], None,
                              timed_calls(SHAPE, H100, "op@v1", shipped=own))  # fmt: skip
    assert mine.borrowed_from == () and " on " not in mine.describe()


def test_a_warm_start_with_no_tuned_call_of_its_own_starts_from_the_siblings_winners(tmp_path):
    from kerneltune._src.caching.tuned_neighbours import hints

    tables = table(tmp_path, entry(H200, (256, 256), "large"), entry(H200, (512, 256), "small"))
    assert hints(SHAPE, H100, "op@v1", None, shipped=tables) == [
        {"tile": "large"},  # the nearest (the same size on the H200) first
        {"tile": "small"},
    ]
    assert hints(SHAPE, A100, "op@v1", None, shipped=tables) == []
    own = table(tmp_path, entry(H200, (256, 256), "large"), entry(H100, (1024, 256), "small"))
    assert hints(SHAPE, H100, "op@v1", None, shipped=own) == [{"tile": "small"}]


def test_a_table_named_for_an_architecture_is_read_only_for_lookups_on_it(tmp_path, monkeypatch):
    # A CPU's first call read the package's Hopper tables (0.1-0.2 s of JSON) for
    # lookups that could never match them.
    def write(name: str, *entries: kt.CacheEntry) -> str:
        path = tmp_path / name
        storage.write_export_file(str(path), [e.to_document() for e in entries], exported=0.0)
        return str(path)

    h100 = write("nvidia-h100-80gb-hbm3.json", entry(H100, (256, 256), "large", "k1"))
    h200 = write("nvidia-h200.json", entry(H200, (256, 256), "small", "k2"))
    other = write("team.json", entry(A100, (256, 256), "small", "k3"))
    read = []
    original = shipped._read_table
    monkeypatch.setattr(shipped, "_read_table", lambda p: read.append(p) or original(p))
    tables = shipped.ShippedTables([h100, h200, other])
    assert tables.get_entry("cpu|jax 0.10", "op@v1", "k1") is None
    assert tables.get_entry(A100, "op@v1", "k3").cfg == {"tile": "small"}
    assert read == [other]
    assert tables.get_entry(H100, "op@v1", "k1").cfg == {"tile": "large"}
    assert [e.call_key for e in tables.sibling_entries_of(H100, "op@v1")] == ["k2"]
    assert sorted(read) == sorted([other, h100, h200])  # each file read once
    assert len(tables) == 3


def test_each_package_table_holds_the_architecture_its_name_says():
    # The rule above rests on the file names `tools/ship_tables.py` writes.
    for path in sorted(shipped.PACKAGE_TABLES.glob("*.json")):
        kinds = {shipped.device_kind_of(e.dev) for e in shipped._read_table(str(path))}
        assert kinds, path
        assert {shipped.architecture_of(k) for k in kinds} == {
            shipped.architecture_of(path.stem)
        }, path
