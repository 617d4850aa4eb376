"""The persistent cache in one process: round trips, damaged entries, read-only and
unwritable locations, URLs, read-only layers, export/import/merge, clear and prune."""

import dataclasses
import json
import logging
import os
import random
import re
import time
import uuid

import pytest

from kerneltune._src.caching import cache_entry, persistent
from kerneltune._src.caching.default_cache import default_persistent_cache
from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.core import files, options
from kerneltune._src.tuning.report import CandidateResult, TuningReport
from tests.helpers import Layout

DEV = "cpu|cpu"
OP = "matmul@v1"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner:
    depth: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cfg:
    block: tuple[int, ...]
    num_warps: int = 4
    scale: float = 1.0
    layout: Layout = Layout.ROW
    stages: int | None = None
    inner: Inner = Inner(depth=2)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Renamed:
    """`Cfg` after a release renamed `num_warps`."""

    block: tuple[int, ...]
    warps: int = 4


def make_report(best: Cfg) -> TuningReport:
    slow = dataclasses.replace(best, num_warps=8)
    broken = dataclasses.replace(best, block=(1024, 1024))
    return TuningReport(
        best=best,
        candidates=(
            CandidateResult(cfg=best, time_s=1.0e-3, samples_s=(1.0e-3, 1.1e-3, 0.9e-3)),
            CandidateResult(cfg=slow, time_s=3.0e-3, samples_s=(3.0e-3, 3.1e-3)),
            CandidateResult(cfg=broken, status="compile_error", error="ValueError: too big"),
        ),
        timer="wallclock",
        heuristic_cfg=slow,
        heuristic_time_s=3.0e-3,
        wall_s=0.25,
    )


def entry_file(root, dev=DEV, op=OP, key="k"):
    return os.path.join(root, "configs", *cache_entry.entry_relpath(dev, op, key).split("/"))


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "kerneltune" and r.levelno == logging.WARNING]


@pytest.fixture
def cache(tmp_path):
    return PersistentCache(tmp_path / "cache")


def test_round_trip_keeps_type_values_and_report(cache):
    cfg = Cfg(block=(64, 32), scale=0.5, layout=Layout.COL, stages=3, inner=Inner(depth=5))
    cache.put(DEV, OP, "k", cfg, report=make_report(cfg), signature="f32[128,256]")

    got = cache.get(DEV, OP, "k", Cfg)
    assert type(got) is Cfg and got == cfg
    assert isinstance(got.block, tuple) and isinstance(got.layout, Layout)
    assert cache.get(DEV, OP, "k") == {
        "block": [64, 32],
        "num_warps": 4,
        "scale": 0.5,
        "layout": "col",
        "stages": 3,
        "inner": {"depth": 5},
    }

    entry = cache.get_entry(DEV, OP, "k")
    assert entry.provenance == "autotuned" and entry.signature == "f32[128,256]"
    assert entry.timer == "wallclock" and entry.best_time_s == 1.0e-3
    assert entry.heuristic_time_s == 3.0e-3 and entry.speedup == pytest.approx(3.0)
    assert [c["status"] for c in entry.candidates] == ["ok", "ok", "compile_error"]
    assert entry.candidates[0]["samples_s"] == [1.0e-3, 1.1e-3, 0.9e-3]
    assert entry.candidates[2]["error"] == "ValueError: too big"
    assert set(entry.versions) == {"kerneltune", "jax", "jaxlib"}
    assert entry.cfg_type.endswith("Cfg") and abs(entry.created - time.time()) < 60
    assert entry.path == entry_file(cache.location, key="k")


def test_misses_len_contains_delete(cache):
    assert cache.get(DEV, OP, "nope", Cfg) is None
    assert len(cache) == 0
    cache.put(DEV, OP, "a", Cfg(block=(8,)))
    cache.put(DEV, "other@v2", "a", {"x": 1})
    cache.put("gpu|cuda 12000", OP, "a", Cfg(block=(16,)))
    assert len(cache) == 3
    assert (DEV, OP, "a") in cache and (DEV, OP, "b") not in cache and "junk" not in cache
    assert cache.get("gpu|cuda 12000", OP, "a", Cfg).block == (16,)
    assert cache.delete(DEV, OP, "a") and not cache.delete(DEV, OP, "a")
    assert len(cache) == 2 and cache.get(DEV, OP, "a") is None


def test_put_overwrites(cache):
    cache.put(DEV, OP, "k", Cfg(block=(8,)))
    cache.put(DEV, OP, "k", Cfg(block=(16,)))
    assert cache.get(DEV, OP, "k", Cfg).block == (16,) and len(cache) == 1


def test_rejects_heuristic_provenance(cache):
    with pytest.raises(ValueError, match=r"provenance must be one of \['autotuned'"):
        cache.put(DEV, OP, "k", Cfg(block=(8,)), provenance="heuristics")
    with pytest.raises(TypeError, match="cfg must be a dataclass instance or a mapping"):
        cache.put(DEV, OP, "k", 42)
    assert len(cache) == 0


def test_config_that_does_not_survive_json_is_not_stored(cache, caplog):
    @dataclasses.dataclass(frozen=True)
    class Odd:
        sizes: frozenset

    cache.put(DEV, OP, "k", Odd(frozenset({1, 2})))
    assert len(cache) == 0
    assert "does not survive a JSON round trip" in warnings_of(caplog)[0].getMessage()


def test_fixed_length_tuple_field_round_trips(cache):
    @dataclasses.dataclass(frozen=True)
    class Pair:
        block: tuple[int, int]

    cache.put(DEV, OP, "k", Pair((64, 32)))
    assert cache.get(DEV, OP, "k", Pair) == Pair((64, 32))


def test_odd_op_ids_and_keys(cache):
    for op in ("my/op:x@v1", "../escape@v1", ".hidden@v0", "ünïcode@v3", "x" * 200 + "@v1"):
        cache.put(DEV, op, "key/with:odd chars", Cfg(block=(4,)))
        assert cache.get(DEV, op, "key/with:odd chars", Cfg) == Cfg(block=(4,))
    assert len(cache) == 5
    for entry in cache.entries():
        assert os.path.realpath(entry.path).startswith(os.path.realpath(cache.location))


def test_lookups_never_list_directories(cache, monkeypatch):
    for i in range(50):
        cache.put(DEV, OP, f"k{i}", Cfg(block=(i + 1,)))

    def forbidden(*args, **kwargs):
        raise AssertionError("a lookup listed a directory")

    for name in ("walk", "scandir", "listdir"):
        monkeypatch.setattr(os, name, forbidden)
    assert cache.get(DEV, OP, "k7", Cfg).block == (8,)
    assert cache.get(DEV, OP, "missing", Cfg) is None
    assert (DEV, OP, "k9") in cache


# --- damaged entries -------------------------------------------------------------------


def _good_document(cache):
    cache.put(DEV, OP, "k", Cfg(block=(64,)), report=make_report(Cfg(block=(64,))))
    with open(entry_file(cache.location)) as f:
        return f.read()


def _truncated(cache):
    text = _good_document(cache)
    return text[: len(text) // 2].encode()


def _random_bytes(cache):
    return random.Random(0).randbytes(300)


def _empty(cache):
    return b""


def _older_schema(cache):
    doc = json.loads(_good_document(cache))
    doc["schema"] = cache_entry.SCHEMA - 1
    return json.dumps(doc).encode()


def _not_an_object(cache):
    return b'["kerneltune.cache_entry", 1]'


def _other_key(cache):
    cache.put(DEV, OP, "another", Cfg(block=(8,)))
    with open(entry_file(cache.location, key="another"), "rb") as f:
        return f.read()


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_truncated, "not valid JSON"),
        (_random_bytes, "not valid JSON"),
        (_empty, "empty"),
        (_older_schema, "older schema"),
        (_not_an_object, "expected a JSON object"),
        (_other_key, "holds another key"),
    ],
)
def test_damaged_entry_is_skipped_with_one_warning(cache, caplog, damage, reason):
    data = damage(cache)
    path = entry_file(cache.location)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)

    caplog.clear()
    assert cache.get(DEV, OP, "k", Cfg) is None
    assert cache.get(DEV, OP, "k") is None  # asked again: no second warning
    assert (DEV, OP, "k") not in cache
    (warning,) = warnings_of(caplog)
    assert reason in warning.getMessage() and path in warning.getMessage()
    assert "retuned" in warning.getMessage()

    # The retuned config replaces it.
    cache.put(DEV, OP, "k", Cfg(block=(128,)))
    assert cache.get(DEV, OP, "k", Cfg) == Cfg(block=(128,))


def test_entry_that_no_longer_fits_the_config_type(cache, caplog):
    cache.put(DEV, OP, "k", Cfg(block=(64,), num_warps=8))
    assert cache.get(DEV, OP, "k", Renamed) is None
    assert cache.get(DEV, OP, "k", Renamed) is None
    (warning,) = warnings_of(caplog)
    assert "no longer fits Renamed" in warning.getMessage()
    assert "num_warps" in warning.getMessage()
    # Without a type it is still plain data; with the right type it still loads.
    assert cache.get(DEV, OP, "k")["num_warps"] == 8
    assert cache.get(DEV, OP, "k", Cfg).num_warps == 8


def test_entries_skip_damaged_files(cache, caplog):
    cache.put(DEV, OP, "good", Cfg(block=(1,)))
    path = entry_file(cache.location, key="bad")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("{")
    assert [e.call_key for e in cache.entries()] == ["good"]
    assert len(warnings_of(caplog)) == 1


# --- locations --------------------------------------------------------------------------


def test_unwritable_location_degrades_to_memory_with_one_warning(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cache = PersistentCache(blocker / "cache")
    cache.put(DEV, OP, "a", Cfg(block=(1,)))
    cache.put(DEV, OP, "b", Cfg(block=(2,)))
    (warning,) = warnings_of(caplog)
    assert "Cannot write to the kerneltune cache" in warning.getMessage()
    assert "in memory for this process only" in warning.getMessage()
    assert cache.memory_only
    assert cache.get(DEV, OP, "a", Cfg) == Cfg(block=(1,))
    assert len(cache) == 2 and {e.call_key for e in cache.entries()} == {"a", "b"}
    assert cache.delete(DEV, OP, "a") and len(cache) == 1


def test_read_only_directory(tmp_path, caplog):
    root = tmp_path / "shared"
    PersistentCache(root).put(DEV, OP, "k", Cfg(block=(64,)))
    dirs = [d for d, _, _ in os.walk(root)]
    for d in dirs:
        os.chmod(d, 0o555)
    try:
        cache = PersistentCache(root)
        assert cache.get(DEV, OP, "k", Cfg) == Cfg(block=(64,))
        cache.put(DEV, "new@v1", "k2", Cfg(block=(8,)))
        assert cache.get(DEV, "new@v1", "k2", Cfg) == Cfg(block=(8,))
        if os.geteuid() != 0:  # root writes through chmod; the blocker test covers it
            assert cache.memory_only
            assert len(warnings_of(caplog)) == 1
        assert cache.get(DEV, OP, "k", Cfg) == Cfg(block=(64,))
    finally:
        for d in dirs:
            os.chmod(d, 0o755)


def test_memory_url(caplog):
    url = f"memory://kerneltune-test-{uuid.uuid4().hex}"
    cache = PersistentCache(url)
    cfg = Cfg(block=(32, 32), layout=Layout.COL)
    cache.put(DEV, OP, "k", cfg, report=make_report(cfg), signature="f32[8]")
    cache.put(DEV, OP, "k2", Cfg(block=(1,)))
    assert cache.get(DEV, OP, "k", Cfg) == cfg
    assert len(cache) == 2
    assert {e.call_key for e in cache.entries()} == {"k", "k2"}
    assert cache.get_entry(DEV, OP, "k").path.startswith("/kerneltune-test-")

    # Another instance on the same URL sees the entries, and export/import work there.
    other = PersistentCache(url)
    assert other.get(DEV, OP, "k", Cfg) == cfg
    assert other.export(url + "/export.json") == 2
    fresh = PersistentCache(f"memory://kerneltune-test-{uuid.uuid4().hex}")
    assert fresh.import_(url + "/export.json") == 2
    assert fresh.get(DEV, OP, "k", Cfg) == cfg

    assert cache.clear(OP) == 2 and len(cache) == 0
    assert not warnings_of(caplog)


def test_file_url_is_a_local_directory(tmp_path):
    cache = PersistentCache(f"file://{tmp_path}/c")
    cache.put(DEV, OP, "k", Cfg(block=(2,)))
    assert os.path.exists(entry_file(str(tmp_path / "c")))


def test_default_cache_follows_the_options(tmp_path, monkeypatch):
    with options.scoped(cache_dir="off"):
        assert default_persistent_cache() is None
        with pytest.raises(ValueError, match="KERNELTUNE_CACHE_DIR=off"):
            PersistentCache()
    with options.scoped(cache_dir=str(tmp_path / "d")):
        first = default_persistent_cache()
        assert first is default_persistent_cache()
        assert first.location == str(tmp_path / "d")
        assert PersistentCache().location == str(tmp_path / "d")
    monkeypatch.delenv("KERNELTUNE_CACHE_DIR")
    assert PersistentCache().location == persistent.default_cache_dir()
    assert persistent.default_cache_dir().rstrip("/").endswith("kerneltune")


def test_unknown_url_protocol(caplog):
    with pytest.raises(ValueError, match="cannot open the cache location"):
        PersistentCache("nosuchprotocol://bucket/cache")
    with options.scoped(cache_dir="nosuchprotocol://bucket/cache"):
        assert default_persistent_cache() is None
    assert "disabled" in warnings_of(caplog)[0].getMessage()


# --- read-only layers -------------------------------------------------------------------


def test_read_only_layers_come_after_the_users_cache(tmp_path):
    shipped = PersistentCache(tmp_path / "shipped")
    shipped.put(DEV, OP, "both", Cfg(block=(1,)), provenance="shipped")
    shipped.put(DEV, OP, "shipped-only", Cfg(block=(2,)), provenance="shipped")
    bundle = tmp_path / "bundle.json"
    PersistentCache(tmp_path / "b").put(DEV, OP, "bundle-only", Cfg(block=(3,)))
    PersistentCache(tmp_path / "b").export(bundle)

    cache = PersistentCache(tmp_path / "user", readonly=[tmp_path / "shipped", bundle])
    cache.put(DEV, OP, "both", Cfg(block=(9,)))
    assert cache.get(DEV, OP, "both", Cfg).block == (9,)
    assert cache.get(DEV, OP, "shipped-only", Cfg).block == (2,)
    assert cache.get_entry(DEV, OP, "shipped-only").provenance == "shipped"
    assert cache.get(DEV, OP, "bundle-only", Cfg).block == (3,)
    assert len(cache) == 1
    keys = sorted(e.call_key for e in cache.entries(readonly_layers=True))
    assert keys == ["both", "bundle-only", "shipped-only"]

    assert cache.clear() == 1
    assert cache.get(DEV, OP, "both", Cfg).block == (1,)  # the shipped one shows again
    assert len(shipped) == 2


def test_a_read_only_layer_that_does_not_fit_falls_through(tmp_path, caplog):
    PersistentCache(tmp_path / "old").put(DEV, OP, "k", {"block": [4], "gone": 1})
    PersistentCache(tmp_path / "newer").put(DEV, OP, "k", Cfg(block=(8,)))
    cache = PersistentCache(tmp_path / "user", readonly=[tmp_path / "old", tmp_path / "newer"])
    assert cache.get(DEV, OP, "k", Cfg) == Cfg(block=(8,))
    assert "gone" in warnings_of(caplog)[0].getMessage()


def test_readonly_layers_from_the_environment(tmp_path, monkeypatch):
    PersistentCache(tmp_path / "team").put(DEV, OP, "k", Cfg(block=(5,)))
    monkeypatch.setenv("KERNELTUNE_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("KERNELTUNE_CACHE_READONLY", f"{tmp_path / 'missing'},{tmp_path / 'team'}")
    cache = PersistentCache()
    assert cache.readonly_locations == (str(tmp_path / "missing"), str(tmp_path / "team"))
    assert cache.get(DEV, OP, "k", Cfg) == Cfg(block=(5,))


def test_bad_bundle_is_skipped(tmp_path, caplog):
    bundle = tmp_path / "broken.json"
    bundle.write_text("{not json")
    cache = PersistentCache(tmp_path / "c", readonly=[bundle])
    assert cache.get(DEV, OP, "k") is None
    assert "Skipping the read-only kerneltune cache" in warnings_of(caplog)[0].getMessage()


# --- sharing ------------------------------------------------------------------------------


def _documents(cache, **changes):
    out = {}
    for e in cache.entries():
        doc = e.to_document()
        doc.update(changes)
        out[e.key] = doc
    return out


def test_export_import_round_trips_every_entry(tmp_path):
    source = PersistentCache(tmp_path / "src")
    for i in range(20):
        cfg = Cfg(block=(2**i,), stages=i % 3 or None)
        report = make_report(cfg) if i % 2 else None
        source.put(DEV if i % 3 else "gpu|cuda", f"op{i % 4}@v1", f"key{i}", cfg, report=report)
    assert source.export(tmp_path / "out.json") == 20

    target = PersistentCache(tmp_path / "dst")
    assert target.import_(tmp_path / "out.json") == 20
    assert _documents(target) == _documents(source, provenance="imported")
    assert target.get(DEV, "op1@v1", "key1", Cfg) == Cfg(block=(2,), stages=1)
    # Importing again changes nothing: the entries there are not older.
    assert target.import_(tmp_path / "out.json") == 0


def test_import_rejects_other_files(tmp_path, cache):
    (tmp_path / "x.json").write_text('{"kind": "something else"}')
    with pytest.raises(ValueError, match="not a kerneltune cache export"):
        cache.import_(tmp_path / "x.json")
    with pytest.raises(OSError):
        cache.import_(tmp_path / "missing.json")


def test_import_and_merge_errors_name_the_file(tmp_path, cache):
    # `merge` takes several sources at once: an error that did not say which file
    # was bad ("cannot merge: it is not a regular file") left the user guessing.
    good = tmp_path / "good.json"
    PersistentCache(tmp_path / "src").export(good)
    other = tmp_path / "other.json"
    other.write_text('{"kind": "something else"}')
    with pytest.raises(ValueError, match=re.escape(f"{other}: not a kerneltune cache export")):
        cache.merge(good, other)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    with pytest.raises(
        files.UnreadableFile, match=re.escape(f"{folder}: it is not a regular file")
    ):
        cache.import_(folder)


def test_import_skips_bad_entries(tmp_path, cache, caplog):
    source = PersistentCache(tmp_path / "src")
    source.put(DEV, OP, "k", Cfg(block=(1,)))
    source.export(tmp_path / "out.json")
    doc = json.loads((tmp_path / "out.json").read_text())
    doc["entries"].append({"kind": "kerneltune.cache_entry", "schema": 0})
    (tmp_path / "out.json").write_text(json.dumps(doc))
    assert cache.import_(tmp_path / "out.json") == 1
    assert "older schema" in warnings_of(caplog)[0].getMessage()


def test_merge_keeps_the_newer_entry(tmp_path, monkeypatch):
    clock = iter([100.0, 101.0, 200.0, 201.0])
    monkeypatch.setattr(persistent, "_now", lambda: next(clock))
    a = PersistentCache(tmp_path / "a")
    b = PersistentCache(tmp_path / "b")
    a.put(DEV, OP, "shared", Cfg(block=(1,)))  # t=100: older
    a.put(DEV, OP, "only-a", Cfg(block=(2,)))
    b.put(DEV, OP, "shared", Cfg(block=(3,)))  # t=200: newer
    b.put(DEV, OP, "only-b", Cfg(block=(4,)))

    for order in ([a, b], [b, a]):
        merged = PersistentCache(tmp_path / f"m{len(os.listdir(tmp_path))}")
        assert merged.merge(*order) >= 3
        assert merged.get(DEV, OP, "shared", Cfg).block == (3,)
        assert merged.get_entry(DEV, OP, "shared").created == 200.0
        assert {e.call_key for e in merged.entries()} == {"shared", "only-a", "only-b"}

    assert b.merge(a) == 1  # only-a; b's shared entry is newer
    assert b.get(DEV, OP, "shared", Cfg).block == (3,)
    assert a.merge(str(tmp_path / "b")) == 2  # newer shared + only-b, by path
    assert a.get(DEV, OP, "shared", Cfg).block == (3,)

    monkeypatch.setattr(persistent, "_now", lambda: 300.0)
    b.export(tmp_path / "b.json")
    c = PersistentCache(tmp_path / "c")
    assert c.merge(tmp_path / "b.json") == 3
    assert c.get_entry(DEV, OP, "shared").provenance == "autotuned"


def read_json(path):
    with open(path) as f:
        return json.load(f)


def test_a_budgeted_entry_says_so_and_gives_way_to_a_full_one(tmp_path, monkeypatch):
    # A first call tuned under a budget timed a few candidates only: a full search's
    # entry replaces it, whether published exclusively, merged or imported, and
    # whatever the ages; a budgeted entry never replaces a full one.
    clock = iter(range(100, 200))
    monkeypatch.setattr(persistent, "_now", lambda: float(next(clock)))
    budgeted = dataclasses.replace(make_report(Cfg(block=(8,))), budgeted=True)
    a = PersistentCache(tmp_path / "a")
    a.put(DEV, OP, "k", Cfg(block=(8,)), report=budgeted)
    entry = a.get_entry(DEV, OP, "k")
    assert entry.budgeted and read_json(entry.path)["budgeted"] is True
    # A full entry written without `budgeted` reads as before budgets existed.
    a.put(DEV, OP, "full", Cfg(block=(8,)), report=make_report(Cfg(block=(8,))))
    assert "budgeted" not in read_json(a.get_entry(DEV, OP, "full").path)
    assert not a.get_entry(DEV, OP, "full").budgeted
    # Exclusive: the budgeted entry gives way; a full one does not.
    assert a.put(DEV, OP, "k", Cfg(block=(16,)), exclusive=True) == Cfg(block=(16,))
    assert a.get(DEV, OP, "k", Cfg) == Cfg(block=(16,)) and not a.get_entry(DEV, OP, "k").budgeted
    again = a.put(DEV, OP, "k", Cfg(block=(32,)), report=budgeted, exclusive=True)
    assert again == Cfg(block=(16,))
    # Merges: full beats budgeted even when older.
    b = PersistentCache(tmp_path / "b")
    b.put(DEV, OP, "k", Cfg(block=(64,)), report=budgeted)  # newer, budgeted
    assert b.merge(a) == 2 and b.get(DEV, OP, "k", Cfg) == Cfg(block=(16,))
    assert a.merge(b) == 0 and a.get(DEV, OP, "k", Cfg) == Cfg(block=(16,))


def test_merge_refuses_a_missing_directory(tmp_path, cache):
    with pytest.raises(FileNotFoundError, match="no cache directory"):
        cache.merge(tmp_path / "typo")


def test_clear_by_op(cache):
    cache.put(DEV, "matmul@v1", "a", Cfg(block=(1,)))
    cache.put(DEV, "matmul@v2", "a", Cfg(block=(1,)))
    cache.put(DEV, "softmax@v1", "a", Cfg(block=(1,)))
    assert cache.clear("matmul@v2") == 1
    assert cache.clear("matmul") == 1
    assert [e.op_id for e in cache.entries()] == ["softmax@v1"]
    assert cache.clear() == 1 and len(cache) == 0


def test_prune(cache, monkeypatch, caplog):
    monkeypatch.setattr(persistent, "_now", lambda: 1_000_000.0)
    cache.put(DEV, OP, "old", Cfg(block=(1,)))
    monkeypatch.setattr(persistent, "_now", lambda: 1_000_000.0 + 5 * 86400)
    cache.put(DEV, OP, "recent", Cfg(block=(2,)))
    cache.put(DEV, OP, "other-jax", Cfg(block=(3,)))
    path = entry_file(cache.location, key="other-jax")
    with open(path) as f:
        doc = json.load(f)
    doc["versions"]["jax"] = "0.0.1"
    with open(path, "w") as f:
        json.dump(doc, f)
    leftover = os.path.join(os.path.dirname(path), ".x.json.123.abc.tmp")
    with open(leftover, "w") as f:
        f.write("{")
    os.utime(leftover, (time.time() - 7200, time.time() - 7200))

    assert cache.prune() == 0
    assert not os.path.exists(leftover)  # stale temporary files go anyway
    assert cache.prune(older_than_days=3) == 1
    assert cache.prune(other_versions=True) == 1
    assert [e.call_key for e in cache.entries()] == ["recent"]
    assert not warnings_of(caplog)
