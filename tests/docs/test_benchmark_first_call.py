"""The held-out regret benchmark (`benchmarks/first_call_gpu.py`) on a CPU: its rows and
its regret arithmetic, with a kernel that has something to tune here (the bundled ops
have one config each on a CPU)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from benchmarks import first_call_gpu
from tests.helpers import RepCfg

pytestmark = pytest.mark.usefixtures("empty_registry")


class Ten(kt.Kernel):
    """Ten configs of different real cost (matrix products), the heuristic in the middle."""

    op_id = "first_call_gpu_ten"

    def run(self, x, *, cfg):
        y = x
        for _ in range(cfg.reps):
            y = y + 0.0 * jnp.tanh(y @ x)
        return y

    def heuristic_cfg(self, inv):
        return RepCfg(reps=6)

    def candidate_cfgs(self, inv):
        return [RepCfg(reps=r) for r in range(10, 0, -1)]


def test_a_row_reports_each_configs_regret_against_the_full_search(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_FIRST_CALL_CANDIDATES", "2")
    x = jax.random.normal(jax.random.PRNGKey(0), (96, 96))
    call = first_call_gpu.as_call(lambda ex, x: ex(Ten(), x), (x,), grad=False)
    (row,) = first_call_gpu.measure("ten", "96x96", call)
    assert row["key"] == "first_call_gpu_ten@v0" and not row["errors"]
    # The first call is a user's jitted step: its compiled program's memory holds at
    # least the argument and the result.
    assert row["first_call_peak_bytes"] >= 2 * x.nbytes
    # The first call timed the heuristic and 2 others of 10 (no table, no neighbour).
    assert row["first_call_how"] == "budgeted"
    regrets = row["regret"]
    assert regrets["predicted"] == regrets["heuristic"]  # no neighbour: the heuristic
    for value in regrets.values():
        assert value is not None and math.isfinite(value) and value >= 0
    assert row["full_search_s"] > 0 and row["first_call_s"] > 0
    # What an offline replay needs: every candidate's time, each chain's choice, and
    # the shortlist the first call timed (the heuristic and 2 others).
    assert len(row["candidates"]) == 10
    assert all(c["status"] == "ok" and c["time_s"] > 0 for c in row["candidates"])
    ids = {c["cfg"] for c in row["candidates"]}
    assert set(row["chosen"]) == {"predicted", "first call", "heuristic"}
    assert set(row["chosen"].values()) <= ids
    assert row["chosen"]["heuristic"] == '{"reps": 6}'
    timed = [c["cfg"] for c in row["first_call_timed"]]
    assert len(timed) == 3 and '{"reps": 6}' in timed and set(timed) <= ids
    table = first_call_gpu.summary([row])
    assert "| first_call_gpu_ten@v0 | 1 |" in table


def test_regret_is_against_the_fastest_and_a_failure_says_so():
    report = kt.TuningReport(
        best=RepCfg(reps=1),
        candidates=(
            kt.CandidateResult(cfg=RepCfg(reps=1), time_s=1e-3),
            kt.CandidateResult(cfg=RepCfg(reps=2), time_s=1.5e-3),
            kt.CandidateResult(cfg=RepCfg(reps=3), status="compile_error", error="x"),
        ),
        timer="cupti",
    )
    assert first_call_gpu.regret(report, RepCfg(reps=2)) == pytest.approx(0.5)
    assert first_call_gpu.regret(report, RepCfg(reps=3)) == math.inf
    assert first_call_gpu.regret(None, RepCfg(reps=1)) is None


def test_a_gradient_row_chooses_the_configs_of_the_differentiated_call():
    x = jax.random.normal(jax.random.PRNGKey(1), (32, 32))
    call = first_call_gpu.as_call(lambda ex, x: ex(Ten(), x), (x,), grad=True)
    (row,) = first_call_gpu.measure("ten", "32x32 grad", call)
    assert row["key"] == "first_call_gpu_ten@v0" and not row["errors"]
    assert all(v is not None and v >= 0 for v in row["regret"].values())


def test_peers_first_calls_are_timed_from_a_fresh_jit_and_a_failure_is_data():
    x = jnp.ones((8, 16), jnp.float32)

    def broken(x):
        raise ValueError("this peer cannot run it")

    peers = {"plain": jax.nn.softmax, "broken": broken}
    out, peaks = first_call_gpu.peer_first_calls(peers, (x,), False)
    assert isinstance(out["plain"], float) and out["plain"] > 0
    assert out["broken"] == "failed: ValueError: this peer cannot run it"
    assert peaks["plain"] >= 2 * x.nbytes and "broken" not in peaks
    grad, _ = first_call_gpu.peer_first_calls({"plain": jnp.matmul}, (x, x.T), True)
    assert isinstance(grad["plain"], float)


def test_the_summary_gives_the_first_call_over_the_fastest_peers():
    row = {
        "key": "op@v0",
        "regret": {"predicted": 0.0, "first call": 0.0, "heuristic": 0.1},
        "first_call_s": 6.0,
        "full_search_s": 20.0,
        "peer_first_call_s": {"plain": 4.0, "tokamax": 2.0, "other": "failed: x"},
    }
    assert first_call_gpu.over_best_peer(row) == pytest.approx(3.0)
    assert "| 6.0 / 6.0 | 3.00x / 3.00x | - | 20.0 |" in first_call_gpu.summary([row])
    assert first_call_gpu.over_best_peer({**row, "peer_first_call_s": {}}) is None
    # Memory: the compiled program's over the smallest peer's (a peer without a figure
    # is left out).
    sized = {
        **row,
        "first_call_peak_bytes": 300,
        "peer_peak_bytes": {"plain": 200, "tokamax": None},
    }
    assert first_call_gpu.memory_over_peer(sized) == pytest.approx(1.5)
    assert "| 3.00x / 3.00x | 1.50x / 1.50x | 20.0 |" in first_call_gpu.summary([sized])


def test_each_op_offers_the_peers_a_user_has():
    ragged = next(first_call_gpu.rows("ragged_dot", smoke=True))
    assert set(ragged[3]) >= {"plain"} and ragged[3]["plain"] is jax.lax.ragged_dot
    assert set(next(first_call_gpu.rows("attention", smoke=True))[3]) == {"plain"}
    assert next(first_call_gpu.rows("layer_norm", smoke=True))[3] == {}  # no plain JAX op


@pytest.mark.slow
def test_the_model_pieces_are_trained_against_plain_jax():
    for op in first_call_gpu.TRAINED:
        label, fn, args, peers = next(first_call_gpu.rows(op, smoke=True))
        assert "plain" in peers, op
        # kerneltune's row and plain JAX's compute the same loss (JAX's default dtype
        # promotion, which jax.nn's attention needs for bf16 on a CPU).
        with jax.numpy_dtype_promotion("standard"):
            ours = fn(None, *args)  # the default executor
            theirs = peers["plain"](*args)
        ours_sum = jnp.sum(jnp.asarray(ours, jnp.float32))
        theirs_sum = jnp.sum(jnp.asarray(theirs, jnp.float32))
        assert jnp.allclose(ours_sum, theirs_sum, rtol=5e-2, atol=5e-2), (op, ours_sum, theirs_sum)


def test_a_training_step_differentiates_every_float_array_of_a_pytree():
    params = {"w": jnp.full((3, 2), 2.0), "b": jnp.ones((2,))}
    labels = jnp.array([1, 0, 1], jnp.int32)

    def loss(p, labels):
        return (jnp.ones((3,)) @ p["w"] + p["b"]) * labels.sum().astype(jnp.float32)

    grads = first_call_gpu.step_of(loss, grad=True)(params, labels)
    # The float leaves in pytree order (b, w); the integer labels are not differentiated.
    assert len(grads) == 2
    assert jnp.allclose(grads[0], 2.0) and jnp.allclose(grads[1], 2.0)


def test_the_model_pieces_shapes_are_in_no_shipped_table():
    """The first call is measured at shapes no table holds: a table key would answer it
    untimed and flatter the prediction."""
    tables = Path(first_call_gpu.__file__).parent.parent / "kerneltune" / "kernels" / "tables"
    entries = [e for f in tables.glob("*.json") for e in json.loads(f.read_text())["entries"]]
    assert entries
    ragged = {
        (e["shape"]["sizes"][0], e["shape"]["sizes"][2])
        for e in entries
        if e["op_id"].startswith("ragged_dot@")
    }
    for s in first_call_gpu.MOE:
        assert (s.tokens * s.top_k, s.experts) not in ragged, s
    vocabularies = {
        e["shape"]["sizes"][4] for e in entries if e["op_id"].startswith("linear_softmax")
    }
    assert not {v for _, _, v in first_call_gpu.LOSS_HEAD} & vocabularies
    glu_sizes = {
        n
        for e in entries
        if e["op_id"].startswith("gated_linear_unit")
        for n in e["shape"]["sizes"]
    }
    assert not {s.hidden for s in first_call_gpu.BLOCK} & glu_sizes


def test_the_rows_are_saved_after_each_row(tmp_path, monkeypatch):
    """A run stopped at a device's time limit keeps the rows it measured."""
    saved = []
    real_save = first_call_gpu._save

    def save(path, *args):
        real_save(path, *args)
        saved.append(len(json.loads(Path(path).read_text())["rows"]))

    monkeypatch.setattr(first_call_gpu, "_save", save)
    out = tmp_path / "rows.json"
    rows = first_call_gpu.main(["--smoke", "--ops", "softmax,layer_norm", "--json", str(out)])
    assert saved == [1, 2] and len(rows) == 2
    assert not (tmp_path / "rows.json.tmp").exists()


def test_shapes_picks_rows_by_index():
    """`--shapes` resumes a run that a device's time limit stopped part way."""
    assert first_call_gpu.main(["--smoke", "--ops", "softmax", "--shapes", "1"]) == []
    (row,) = first_call_gpu.main(["--smoke", "--ops", "softmax", "--shapes", "0"])
    assert row["shape"] == "64x96"


def test_the_breakdown_table_divides_by_the_fastest_peer_and_shows_failures():
    from benchmarks import first_call_breakdown as fcb

    def r(variant, first, options="default", compile_s=1.0, step_ms=5.0):
        return {"row": "head", "variant": variant, "options": options, "start_s": 2.0,
                "lower_s": 0.1, "compile_s": compile_s, "first_call_s": first,
                "step_ms": step_ms}  # fmt: skip

    results = [
        r("kerneltune", 3.0), r("plain", 2.5), r("tokamax", 1.5),
        r("kerneltune", 0.9, "no_autotune", compile_s=0.48, step_ms=7.0),
        {"row": "head", "variant": "tokamax", "options": "no_autotune", "error": "exit 1: boom"},
        r("kerneltune", 1.0, "no_triton_gemm", compile_s=0.61, step_ms=5.5),
    ]  # fmt: skip
    lines = fcb.table(results).splitlines()
    assert lines[0].split("|")[6:12] == [
        " step ms ", " compile s, no_autotune ", " step ms, no_autotune ",
        " compile s, no_triton_gemm ", " step ms, no_triton_gemm ", " ÷ best peer ",
    ]  # fmt: skip
    kt_line = next(line for line in lines if "| kerneltune |" in line)
    # 3.0 s over tokamax's 1.5 s; each option set's compile and step in its columns.
    assert kt_line.endswith("| 5.00 | 0.48 | 7.00 | 0.61 | 5.50 | 2.00x |")
    tk = next(line for line in lines if "| tokamax |" in line).split("|")
    assert [c.strip() for c in tk[7:11]] == ["failed", "failed", "-", "-"]
    plain = next(line for line in lines if "| plain |" in line).split("|")
    assert [c.strip() for c in plain[7:9]] == ["-", "-"]


def test_the_breakdown_refuses_an_unknown_option_set(capsys):
    from benchmarks import first_call_breakdown as fcb

    with pytest.raises(SystemExit):
        fcb.main(["--smoke", "--compare", "no_autotune,fast"])
    assert "unknown option set(s) ['fast']" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_breakdown_runs_each_first_call_in_a_fresh_process(tmp_path):
    from benchmarks import first_call_breakdown as fcb

    out = tmp_path / "breakdown.json"
    results = fcb.main(["--smoke", "--ops", "ragged_dot", "--no-autotune", "--json", str(out)])
    assert json.loads(out.read_text()) == results
    assert [(r["variant"], r["options"]) for r in results] == [
        ("kerneltune", "default"), ("plain", "default"),
        ("kerneltune", "no_autotune"), ("plain", "no_autotune"),
    ]  # fmt: skip
    for r in results:
        assert "error" not in r, r
        assert 0 < r["lower_s"] < r["first_call_s"] and r["compile_s"] > 0 and r["start_s"] > 0
        assert r["step_ms"] > 0 and r["triton_gemms"] == 0  # no Triton GEMMs on a CPU
