"""The release tools that write the shipped tables, on a CPU: `tools/ship_tables.py`'s
ragged_dot grid and its `--shard` split, and `tools/merge_tables.py`, which joins the
shards' table files. Nothing here tunes: the GPU runs are the tools' own."""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest

import kerneltune as kt
from benchmarks import first_call_gpu
from kerneltune._src.caching import storage
from tools import merge_tables
from tools import ship_tables as st

H200 = "NVIDIA H200|cuda 13000"


def test_the_ragged_grid_is_none_of_the_first_call_benchmarks_held_out_shapes():
    # first_call_gpu measures the prediction at shapes no table holds: a table key at
    # one of them would turn its regret into a table lookup.
    assert len(st.RAGGED) == len(set(st.RAGGED)) == 36
    assert not set(st.RAGGED) & set(first_call_gpu.RAGGED)


def test_the_ragged_grid_calls_forward_and_the_gradient_of_both_operands(monkeypatch):
    monkeypatch.setattr(st, "RAGGED", [(64, 32, 16, 4), (48, 16, 32, 2), (32, 16, 16, 2)])
    forward = dict(st.grid("ragged_dot"))
    assert list(forward) == ["64x32x16 G4", "48x16x32 G2", "32x16x16 G2"]
    out = forward["48x16x32 G2"](None)  # the default executor, as a user's call
    assert (out.shape, out.dtype) == ((48, 32), jnp.bfloat16)

    grad = dict(st.grid("ragged_dot_grad"))
    assert list(grad) == ["64x32x16 G4", "32x16x16 G2"]  # every other shape
    dlhs, drhs = grad["64x32x16 G4"](None)
    assert (dlhs.shape, drhs.shape) == ((64, 32), (4, 32, 16))
    assert float(jnp.abs(drhs[-1]).max()) == 0.0  # the empty expert gets no gradient
    assert float(jnp.abs(drhs[0].astype(jnp.float32)).max()) > 0.0


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("length", [0, 5, 54, 117])
def test_the_shards_of_a_run_are_disjoint_cover_it_and_differ_by_one_call_at_most(count, length):
    calls = [f"call {i}" for i in range(length)]
    shards = [list(st.in_shard(iter(calls), st.Shard(i, count))) for i in range(1, count + 1)]
    taken = [c for shard in shards for c in shard]
    assert sorted(taken) == sorted(calls) and len(taken) == len(set(taken))
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 1


def test_each_shard_of_the_ragged_run_gets_every_expert_count_and_both_row_counts():
    run = [("ragged_dot", s) for s in st.RAGGED] + [("ragged_dot_grad", s) for s in st.RAGGED[::2]]
    for i in range(1, 5):
        shard = list(st.in_shard(run, st.Shard(i, 4)))
        assert {g for _, (_, _, _, g) in shard} == {8, 16, 32, 64, 128, 256}
        assert {m for _, (m, _, _, _) in shard} == {8192, 32768}


def test_no_shard_is_the_whole_run():
    assert list(st.in_shard(range(5), None)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("text", ["2/4", "1/1", "4/4", " 3/ 8"])
def test_a_shard_is_read_as_part_i_of_n_counting_from_one(text):
    i, n = (int(t) for t in text.split("/"))
    assert st.parse_shard(text) == st.Shard(i, n)


@pytest.mark.parametrize("text", ["0/4", "5/4", "4", "1/0", "-1/4", "a/b", "1/2/3", ""])
def test_a_bad_shard_is_refused_naming_the_option_and_its_value(text, capsys):
    with pytest.raises(SystemExit) as e:
        st.main(["--ops", "ragged_dot", f"--shard={text}"])
    assert e.value.code == 2  # before any GPU is looked for
    err = capsys.readouterr().err
    assert "--shard" in err and repr(text) in err and "1 <= I <= N" in err


def entry(op: str, key: str, best: float, dev: str = H200) -> dict:
    return {
        "op_id": op,
        "call_key": key,
        "dev": dev,
        "signature": f"sig {key}",
        "best_time_s": best,
    }


def table(tmp_path, name: str, *docs: dict) -> str:
    path = str(tmp_path / name)
    storage.write_export_file(path, list(docs), exported=0.0)
    return path


def entries(path: str) -> dict:
    with open(path) as f:
        doc = json.load(f)
    assert doc["kind"] == storage.EXPORT_KIND
    return {(d["op_id"], d["call_key"], d["dev"]): d["best_time_s"] for d in doc["entries"]}


def test_merged_shards_hold_each_entry_once_the_later_file_winning(tmp_path):
    a = table(tmp_path, "a.json", entry("ragged_dot@v1", "k1", 1.0), entry("matmul@v3", "k2", 2.0))
    b = table(tmp_path, "b.json", entry("ragged_dot@v1", "k1", 3.0), entry("matmul@v3", "k3", 4.0))
    out = str(tmp_path / "merged.json")
    assert merge_tables.main([a, b, "--out", out]) == 0
    assert entries(out) == {
        ("ragged_dot@v1", "k1", H200): 3.0,
        ("matmul@v3", "k2", H200): 2.0,
        ("matmul@v3", "k3", H200): 4.0,
    }
    assert merge_tables.main([b, a, "--out", out]) == 0
    assert entries(out)[("ragged_dot@v1", "k1", H200)] == 1.0


def test_a_merge_keeps_the_tables_other_entries_and_replaces_those_the_shards_hold(tmp_path):
    out = table(
        tmp_path, "package.json", entry("attention@v1", "k0", 5.0), entry("x@v1", "k1", 6.0)
    )
    shard = table(tmp_path, "shard1.json", entry("x@v1", "k1", 7.0))
    assert merge_tables.main([shard, "--out", out]) == 0
    assert entries(out) == {("attention@v1", "k0", H200): 5.0, ("x@v1", "k1", H200): 7.0}


def test_the_merged_table_is_the_same_whatever_order_the_shards_come_in(tmp_path):
    docs = [entry(f"op{i % 3}@v1", f"k{i}", float(i)) for i in range(9)]
    a, b = table(tmp_path, "a.json", *docs[::2]), table(tmp_path, "b.json", *docs[1::2])
    merge_tables.main([a, b, "--out", str(tmp_path / "ab.json")])
    merge_tables.main([b, a, "--out", str(tmp_path / "ba.json")])
    ab, ba = (json.loads((tmp_path / f).read_text())["entries"] for f in ("ab.json", "ba.json"))
    assert ab == ba and len(ab) == 9


def test_tables_of_two_device_kinds_are_not_merged(tmp_path, capsys):
    a = table(tmp_path, "a.json", entry("matmul@v3", "k1", 1.0))
    h100 = "NVIDIA H100 80GB HBM3|cuda 13000"
    b = table(tmp_path, "b.json", entry("matmul@v3", "k2", 1.0, dev=h100))
    out = tmp_path / "merged.json"
    assert merge_tables.main([a, b, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "different device kinds" in err and "NVIDIA H200" in err and "NVIDIA H100" in err
    assert not out.exists()


def test_a_table_at_out_of_another_device_kind_is_not_merged_into(tmp_path, capsys):
    out = table(tmp_path, "h100.json", entry("matmul@v3", "k1", 1.0, dev="NVIDIA H100|cuda 1"))
    shard = table(tmp_path, "shard1.json", entry("matmul@v3", "k2", 2.0))
    assert merge_tables.main([shard, "--out", out]) == 1
    assert "different device kinds" in capsys.readouterr().err
    assert entries(out) == {("matmul@v3", "k1", "NVIDIA H100|cuda 1"): 1.0}


def test_the_merged_table_is_the_package_table_of_the_shards_device_kind(tmp_path, monkeypatch):
    monkeypatch.setattr(merge_tables, "table_path", lambda kind: str(tmp_path / f"{kind}.json"))
    shard = table(tmp_path, "shard1.json", entry("matmul@v3", "k1", 1.0))
    assert merge_tables.main([shard]) == 0
    assert entries(str(tmp_path / "NVIDIA H200.json")) == {("matmul@v3", "k1", H200): 1.0}
    assert st.table_path("NVIDIA H200").endswith("kerneltune/kernels/tables/nvidia-h200.json")


def test_a_file_that_is_not_a_table_is_refused_by_name(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "something else"}))
    assert merge_tables.main([str(bad), "--out", str(tmp_path / "m.json")]) == 1
    assert str(bad) in capsys.readouterr().err


def test_a_shard_without_an_out_file_of_its_own_is_refused(capsys):
    # Shards writing the one package table would each rewrite it with their own keys.
    with pytest.raises(SystemExit) as e:
        st.main(["--ops", "ragged_dot", "--shard", "1/2"])
    assert e.value.code == 2
    assert "--shard needs an --out file of its own" in capsys.readouterr().err


def test_an_entry_missing_a_field_is_refused_with_a_message_not_a_traceback(tmp_path, capsys):
    path = tmp_path / "shard.json"
    doc = entry("ragged_dot@v1", "k1", 1.0)
    del doc["dev"]
    storage.write_export_file(str(path), [doc], exported=0.0)
    assert merge_tables.main([str(path), "--out", str(tmp_path / "m.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("merge_tables: KeyError") and "dev" in err


def test_each_call_says_how_many_keys_it_added_and_the_run_names_those_that_added_none(
    tmp_path, capsys
):
    # The attention variants' grid once wrote an empty table: every GPU variant call
    # has one candidate (the heuristic's), so nothing was tuned, and nothing said so.
    cache = kt.PersistentCache(str(tmp_path))

    def tunes(ex):
        cache.put("cpu|cpu", "op@v0", "a", {"b": 1})
        return jnp.zeros(2)

    def fails(ex):
        raise ValueError("no such shape")

    calls = [
        ("op", "tunes", tunes),
        ("op", "reads", lambda ex: jnp.ones(2)),
        ("op", "fails", fails),
    ]
    assert st.run_calls(calls, None, cache) == ["op reads", "op fails"]
    lines = capsys.readouterr().out.splitlines()
    assert "+1 keys" in lines[0] and "+0 keys" in lines[1]
    assert "+0 keys  FAILED: ValueError" in lines[2]


def test_the_attention_variants_are_not_an_op_of_the_tables():
    with pytest.raises(SystemExit, match="unknown op 'attention_variants'"):
        list(st.grid("attention_variants"))


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_the_norm_grid_tunes_on_random_parameters_under_the_keys_of_the_defaults(op, monkeypatch):
    # The grid called the norms with x alone: the bias was filled with zeros, and every
    # layer_norm key was tuned under "timings on zeros can flatter some configs".
    norm = getattr(kt.kernels, op)
    given = []

    def spy(*args, **kwargs):
        given.append(args)
        return norm(*args, **kwargs)

    monkeypatch.setattr(kt.kernels, op, spy)
    label, call = next(iter(st.grid(op)))
    rows, width = map(int, label.split("x"))
    keys = {}
    for name, run in (
        ("grid", call),
        ("defaults", lambda ex: norm(jnp.ones((rows, width), jnp.bfloat16), executor=ex)),
    ):
        kt.clear_invocations()
        with kt.record_calls():
            run(kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache())))
        (recorded,) = kt.get_invocations().values()
        keys[name] = set(recorded)
    assert keys["grid"] == keys["defaults"]
    (args,) = given
    params = args[1:]
    assert len(params) == {"layer_norm": 2, "rms_norm": 1}[op]
    assert all(float(jnp.std(p.astype(jnp.float32))) > 0.5 for p in params)
