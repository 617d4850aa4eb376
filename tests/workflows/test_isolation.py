"""`kerneltune tune --isolate` (issue 12.6): a candidate that crashes or hangs its
worker process costs that candidate, recorded with its reason; tuning goes on."""

import jax
import pytest

import kerneltune as kt
from tests.offline_kernels import LoopCfg
from tests.worker_kernels import CrashingKernel, HangingKernel, SteadyKernel
from tests.workflows.test_tune_workers import record_manifest, tune

TYPES = {"crashing": LoopCfg, "hanging": LoopCfg, "aaa_steady": LoopCfg}


@pytest.mark.parametrize(
    "kernel, extra, reason",
    [
        (CrashingKernel(), [], "the worker process died while it ran (exit -11)"),
        (HangingKernel(), ["--run-timeout", "3"], "its first run took more than 3 s"),
    ],
)
def test_a_crashing_or_hanging_candidate_costs_only_itself(tmp_path, kernel, extra, reason):
    manifest, out = tmp_path / "calls.json", tmp_path / "result.json"
    keys = record_manifest(manifest, [(SteadyKernel(), 64), (kernel, 64)])
    proc = tune(
        "--cache-dir", str(tmp_path / "cache"), "tune", str(manifest), "--isolate",
        "--out", str(out), "--no-progress", "--import", "tests.worker_kernels", *extra,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"candidate reps=2 was dropped: {reason}" in proc.stdout
    result = kt.AutotuningResult.load(out, TYPES)
    assert {(e.op_id_v, e.call_key) for e in result} == keys  # every key has a config
    (entry,) = [e for e in result if e.op_id_v.startswith(kernel.op_id)]
    assert entry.cfg != LoopCfg(reps=2)
    # The culprit is in the key's report, with its reason.
    (culprit,) = [t for t in entry.timings if t["cfg"] == {"reps": 2}]
    assert culprit["status"] in ("run_error", "timeout") and reason in culprit["error"]


def test_the_journal_is_inert_outside_an_isolated_worker():
    # Found by the docs' code blocks: after any offline tuning, the journal held a key,
    # and a tuner given non-config candidates (kt.autotune(f)'s two variants) crashed
    # on them.
    from kerneltune._src.tuning import journal

    journal.tuning_key("op@v0", "k")
    assert journal.excluded_reason("heuristic configs") is None
    assert journal.excluded_reason(LoopCfg(reps=2)) is None
    tuner = kt.Tuner(progress=False, iters=1)
    report = tuner.tune(lambda name: lambda x: x * 2.0, [jax.numpy.ones(4)], {}, ["a", "b"])
    assert report.best in ("a", "b")


def test_the_api_opt_in_tunes_in_isolated_workers(tmp_path, caplog):
    from kerneltune._src.kernel import recording

    recording.clear_invocations()
    ex = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )
    with recording.record_calls():
        for kernel in (SteadyKernel(), CrashingKernel()):
            ex(kernel, jax.numpy.ones((64, 64)))
    records = recording.get_invocations()
    recording.clear_invocations()
    cache = kt.PersistentCache(tmp_path / "cache")
    chain = kt.ConfigSelectorChain(kt.ConfigCache(), persistent=cache)
    with caplog.at_level("WARNING", logger="kerneltune"):
        result = kt.autotune_recorded(records, selector=chain, isolate=True)
    # Before: no opt-in; in this process the segfaulting candidate killed the test run.
    assert {e.op_id_v.split("@")[0] for e in result} == {"aaa_steady", "crashing"}
    assert "dropped candidate {'reps': 2}: the worker process died while it ran" in caplog.text
    assert len(cache) == 2  # the workers wrote the winners where this selector reads
    with pytest.raises(ValueError, match="run_timeout_s"):
        kt.autotune_recorded(records, selector=chain, run_timeout_s=1.0)
