"""Hostile files in a shared cache: nested brackets, huge integers, FIFOs, huge files,
wrong-typed config values, planted symlinks, umask 000 (issue 12, items 2, 3 and 8)."""

import dataclasses
import json
import logging
import os
import pathlib
import stat
import threading
import time
import tracemalloc
from typing import Literal

import pytest

from kerneltune._src.caching import cache_entry, persistent
from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.core import configs, files
from tests.helpers import Layout

DEV = "cpu|cpu"
OP = "hostile@v1"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner:
    warps: int = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cfg:
    block: int = 64
    scale: float = 1.0
    name: str | None = None
    backend: Literal["a", "b"] = "a"
    layout: Layout = Layout.ROW
    dims: tuple[int, int] = (1, 2)
    inner: Inner = Inner()
    fast: bool = False

    def __post_init__(self) -> None:
        if self.block <= 0:
            raise ValueError(f"block must be positive, got {self.block}")


def warnings_of(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING]


def entry_path(cache: PersistentCache, key: str) -> str:
    return cache._store.full_path(cache_entry.entry_relpath(DEV, OP, key))


def plant(cache: PersistentCache, key: str, data: bytes) -> str:
    path = entry_path(cache, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def with_cfg_field(cache: PersistentCache, key: str, **fields) -> str:
    """A valid entry for `key`, then its stored config fields overwritten."""
    cache.put(DEV, OP, key, Cfg())
    path = entry_path(cache, key)
    doc = json.loads(pathlib.Path(path).read_text())
    doc["cfg"].update(fields)
    pathlib.Path(path).write_text(json.dumps(doc))
    return path


# --- item 2: every entry is checked against the config type -----------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"block": "64"},
        {"block": 3.5},
        {"block": None},
        {"block": -1},  # the config's own validation
        {"block": True},
        {"scale": "1.0"},
        {"backend": "c"},
        {"layout": "diagonal"},
        {"dims": [1, 2, 3]},
        {"dims": ["1", 2]},
        {"inner": {"warps": "4"}},
        {"fast": 1},
    ],
)
def test_wrong_typed_config_is_skipped_with_one_warning_and_replaced(tmp_path, caplog, fields):
    cache = PersistentCache(tmp_path)
    path = with_cfg_field(cache, "k", **fields)
    assert cache.get(DEV, OP, "k", Cfg) is None
    assert cache.get(DEV, OP, "k", Cfg) is None
    (warning,) = warnings_of(caplog)
    assert path in warning.getMessage()
    cache.put(DEV, OP, "k", Cfg(block=32), exclusive=True)  # an invalid entry is overwritten
    assert cache.get(DEV, OP, "k", Cfg) == Cfg(block=32)


def test_nan_in_an_entry_is_rejected(tmp_path, caplog):
    cache = PersistentCache(tmp_path)
    path = with_cfg_field(cache, "k")
    text = pathlib.Path(path).read_text().replace('"scale": 1.0', '"scale": NaN')
    pathlib.Path(path).write_text(text)
    assert cache.get(DEV, OP, "k", Cfg) is None
    assert "NaN" in warnings_of(caplog)[0].getMessage()


def test_valid_values_of_every_kind_come_back(tmp_path):
    cache = PersistentCache(tmp_path)
    cfg = Cfg(block=8, scale=2, name="x", backend="b", layout=Layout.COL, dims=(3, 4))
    cache.put(DEV, OP, "k", cfg)
    assert cache.get(DEV, OP, "k", Cfg) == cfg
    assert configs.config_from_dict({"scale": 2}, Cfg).scale == 2.0


def test_prune_removes_invalid_entries(tmp_path):
    cache = PersistentCache(tmp_path)
    cache.put(DEV, OP, "good", Cfg())
    with_cfg_field(cache, "bad", block="64")
    plant(cache, "corrupt", b"[[[")
    assert cache.prune(invalid=True, cfg_types={"hostile": Cfg}) == 2
    assert [e.call_key for e in cache.entries()] == ["good"]


def test_prune_rejects_a_negative_age(tmp_path):
    cache = PersistentCache(tmp_path)
    cache.put(DEV, OP, "k", Cfg())
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError, match="older_than_days"):
            cache.prune(older_than_days=bad)
    assert len(cache) == 1


# --- item 3: one bounded reader -----------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 2000 + b"]" * 2000,
        b'{"a":' * 1000 + b"1" + b"}" * 1000,
        b'{"kind": "kerneltune.cache_entry", "schema": ' + b"9" * 5000 + b"}",
        b"",
        b"\xff\xfe",
    ],
)
def test_hostile_entry_is_a_miss_with_one_warning(tmp_path, caplog, data):
    cache = PersistentCache(tmp_path)
    path = plant(cache, "k", data)
    assert cache.get(DEV, OP, "k", Cfg) is None
    assert list(cache.entries()) == []
    (warning,) = warnings_of(caplog)
    assert path in warning.getMessage()


def test_fifo_at_an_entry_path_never_hangs(tmp_path, caplog):
    cache = PersistentCache(tmp_path)
    path = entry_path(cache, "k")
    os.makedirs(os.path.dirname(path))
    os.mkfifo(path)
    done = []
    reader = threading.Thread(target=lambda: done.append(cache.get(DEV, OP, "k", Cfg)))
    reader.daemon = True
    reader.start()
    reader.join(10)
    assert done == [None]
    assert "not a regular file" in warnings_of(caplog)[0].getMessage()
    with pytest.raises(files.UnreadableFile, match="not a regular file"):
        files.read_json(path)


def test_huge_entry_is_rejected_before_it_is_read(tmp_path, caplog):
    cache = PersistentCache(tmp_path)
    path = plant(cache, "k", b"")
    with open(path, "wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: 100 MB that cost no disk
    tracemalloc.start()
    try:
        assert cache.get(DEV, OP, "k", Cfg) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024
    assert "bytes (at most" in warnings_of(caplog)[0].getMessage()


def test_export_import_and_results_use_the_bounded_reader(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"[" * 5000)
    cache = PersistentCache(tmp_path / "c")
    with pytest.raises(ValueError, match="nests deeper"):
        cache.import_(bad)
    import kerneltune as kt

    with pytest.raises(ValueError, match="nests deeper"):
        kt.AutotuningResult.load(bad)
    with pytest.raises(ValueError, match="digit integer"):
        kt.AutotuningResult.loads('{"kind": ' + "1" * 5000 + "}")


# --- item 8: the smaller ones ----------------------------------------------------------------


def test_readonly_given_as_one_string_is_one_layer(tmp_path):
    shipped = PersistentCache(tmp_path / "shipped")
    shipped.put(DEV, OP, "k", Cfg(block=16))
    shipped.export(tmp_path / "shipped.json")
    cache = PersistentCache(tmp_path / "c", readonly=str(tmp_path / "shipped.json"))
    assert cache.readonly_locations == (str(tmp_path / "shipped.json"),)
    assert cache.get(DEV, OP, "k", Cfg) == Cfg(block=16)


def test_one_unwritable_entry_path_keeps_the_others_on_disk(tmp_path, caplog):
    cache = PersistentCache(tmp_path)
    blocked = entry_path(cache, "blocked")
    os.makedirs(os.path.dirname(os.path.dirname(blocked)))
    open(os.path.dirname(blocked), "w").close()  # a file where its folder should be
    cache.put(DEV, OP, "blocked", Cfg(block=8))
    cache.put(DEV, OP, "fine", Cfg(block=16))
    assert os.path.isfile(entry_path(cache, "fine"))
    assert PersistentCache(tmp_path).get(DEV, OP, "fine", Cfg) == Cfg(block=16)
    assert cache.get(DEV, OP, "blocked", Cfg) == Cfg(block=8)  # kept in memory


def test_entries_are_not_world_writable_under_umask_000(tmp_path):
    old = os.umask(0)
    try:
        cache = PersistentCache(tmp_path)
        cache.put(DEV, OP, "k", Cfg())
        path = entry_path(cache, "k")
        assert not os.stat(path).st_mode & stat.S_IWOTH
        assert not os.stat(os.path.dirname(path)).st_mode & stat.S_IWOTH
    finally:
        os.umask(old)


def test_temporaries_of_dead_writers_go_at_once(tmp_path):
    cache = PersistentCache(tmp_path)
    cache.put(DEV, OP, "k", Cfg())
    folder = os.path.dirname(entry_path(cache, "k"))
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    dead = files.temp_name("x.json").replace(f".{os.getpid()}.", f".{pid}.")
    live = files.temp_name("y.json")
    for name in (dead, live):
        open(os.path.join(folder, name), "w").close()
    cache.prune()
    assert sorted(os.listdir(folder)) == sorted([live, os.path.basename(entry_path(cache, "k"))])


def test_temporary_files_never_follow_a_planted_symlink(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    names = iter([".planted.tmp", ".fresh.tmp"])
    monkeypatch.setattr(files, "temp_name", lambda name: next(names))
    os.symlink(victim, tmp_path / ".planted.tmp")
    files.write_atomic(tmp_path / "out.json", b"{}")
    assert victim.read_text() == "precious"
    assert (tmp_path / "out.json").read_bytes() == b"{}"


def test_results_and_manifests_do_not_write_through_predictable_names(tmp_path):
    import kerneltune as kt
    from kerneltune._src.caching import manifest

    victim = tmp_path / "victim"
    victim.write_text("precious")
    for target in (tmp_path / "r.json", tmp_path / "m.json"):
        os.symlink(victim, f"{target}.tmp{os.getpid()}.{threading.get_ident()}")
    kt.AutotuningResult(DEV, (kt.Entry(OP, "k", {"block": 1}),)).save(tmp_path / "r.json")
    manifest.save_manifest(tmp_path / "m.json", [])
    assert victim.read_text() == "precious"


def test_processes_that_miss_the_same_key_adopt_the_first_published_entry(tmp_path):
    first, second = PersistentCache(tmp_path), PersistentCache(tmp_path)
    assert first.put(DEV, OP, "k", Cfg(block=8), exclusive=True) == Cfg(block=8)
    assert second.put(DEV, OP, "k", Cfg(block=16), exclusive=True) == Cfg(block=8)
    assert PersistentCache(tmp_path).get(DEV, OP, "k", Cfg) == Cfg(block=8)
    second.put(DEV, OP, "k", Cfg(block=16))  # not exclusive: --force replaces
    assert PersistentCache(tmp_path).get(DEV, OP, "k", Cfg) == Cfg(block=16)


def test_result_files_keep_the_heuristic_bar(tmp_path):
    import kerneltune as kt

    entry = kt.Entry(
        OP, "k", {"block": 8}, heuristic_cfg={"block": 64}, strategy="exhaustive", wall_s=1.5
    )
    kt.AutotuningResult(DEV, (entry,)).save(tmp_path / "r.json")
    (back,) = kt.AutotuningResult.load(tmp_path / "r.json")
    assert (back.heuristic_cfg, back.strategy, back.wall_s) == ({"block": 64}, "exhaustive", 1.5)
    cache = PersistentCache(tmp_path / "c")
    cache.import_(tmp_path / "r.json")
    (stored,) = cache.entries()
    assert stored.heuristic_cfg == {"block": 64} and stored.strategy == "exhaustive"


def test_old_entries_stay_readable_after_a_clock_patch(tmp_path, monkeypatch):
    monkeypatch.setattr(persistent, "_now", lambda: time.time() - 10 * 86400)
    cache = PersistentCache(tmp_path)
    cache.put(DEV, OP, "k", Cfg())
    monkeypatch.undo()
    assert cache.prune(older_than_days=5) == 1


def test_an_invalid_entry_is_retuned_and_overwritten_through_the_chain(tmp_path, caplog):
    import jax.numpy as jnp

    import kerneltune as kt

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Blocks:
        block: int = 1

        def __post_init__(self) -> None:
            if self.block not in (1, 2):
                raise ValueError(f"block must be 1 or 2, got {self.block}")

    class Doubler(kt.Kernel):
        op_id = "hostile_doubler"
        config_type = Blocks
        key_builder = staticmethod(lambda inv: "fixed-key")

        def run(self, x, *, cfg):
            return x * 2.0

        def heuristic_cfg(self, inv):
            return Blocks()

        def candidate_cfgs(self, inv):
            return [Blocks(block=1), Blocks(block=2)]

    cache = PersistentCache(tmp_path)
    key = (kt.device_fingerprint(), "hostile_doubler@v0", "fixed-key")
    cache.put(*key, {"block": True})  # True == 1 passes the class check, not the type
    chain = kt.ConfigSelectorChain(kt.ConfigCache(), policy=kt.AutotunePolicy(), persistent=cache)
    out = kt.Executor(chain)(Doubler(), jnp.ones(4))
    assert out.tolist() == [2.0] * 4
    (warning,) = [w for w in warnings_of(caplog) if "Skipping" in w.getMessage()]
    assert cache._store.full_path(cache_entry.entry_relpath(*key)) in warning.getMessage()
    assert PersistentCache(tmp_path).get(*key, cfg_type=Blocks) in (
        Blocks(block=1),
        Blocks(block=2),
    )


def test_attention_backward_tuning_inputs_take_a_custom_non_hex_key():
    # Issue 12.8 leftover: the seed was int(call_key[:8], 16), which crashed on a key
    # from a custom key_builder.
    import jax

    from kerneltune._src.kernel.base import make_invocation
    from kerneltune.kernels.attention import AttentionBackwardInterpret

    kernel = AttentionBackwardInterpret()
    q = jax.ShapeDtypeStruct((1, 16, 2, 16), "float32")
    lse = jax.ShapeDtypeStruct((1, 2, 16), "float32")
    inv = make_invocation(kernel, (q, q, q, q, lse, q), {"causal": True, "sm_scale": 0.25})
    inv = dataclasses.replace(inv, key_builder=lambda inv: "my-key/attention-bwd")
    assert inv.call_key == "my-key/attention-bwd"
    args, _ = kernel.tuning_inputs(inv)
    assert all(a.shape == s.shape for a, s in zip(args, (q, q, q, q, lse, q), strict=True))
