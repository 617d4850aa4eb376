"""Several real processes joined by `jax.distributed.initialize` on localhost (CPU) must
end with the same config, although each one, alone, would pick a different one.

Each process makes a candidate dearer through `KT_TEST_SLOW` (read while the kernel is
traced), so their local winners differ. This file is also the worker: the test runs it
as a script, once per process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, xla_flags_with_devices

# Candidate cost in matrix products; a candidate named in KT_TEST_SLOW costs SLOW× more.
BASE = {"a": 1, "b": 1, "c": 6}
SLOW = 40
SIZE = 128
#: The matrix sizes of the recorded calls of the "split" mode (one key each).
SPLIT_SIZES = (16, 24, 32, 40, 48, 56)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SkewCfg:
    variant: str


CANDIDATES = [SkewCfg(variant=v) for v in "abc"]
#: The order the selection chain tunes them in: the kernel's heuristic ("c") first.
TUNED_ORDER = [CANDIDATES[2], CANDIDATES[0], CANDIDATES[1]]


# -- the test (parent side) ------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    n: int,
    slow: list[str],
    mode: str = "agree",
    env: dict[str, str] | None = None,
    limit_s: float = 150,
):
    port = _free_port()
    procs = []
    for pid in range(n):
        child_env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": xla_flags_with_devices(1),
            "KERNELTUNE_CACHE_DIR": "off",
            "KT_TEST_SLOW": slow[pid],
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **(env or {}),
        }
        args = [sys.executable, __file__, str(pid), str(n), str(port), mode]
        procs.append(
            subprocess.Popen(
                args, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    deadline = time.monotonic() + limit_s
    results, logs = [], []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs.append(err[-3000:])
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            assert p.returncode == 0 and lines, (
                f"process exited {p.returncode}:\n{out}\n{err[-3000:]}"
            )
            results.append(json.loads(lines[-1][len("RESULT ") :]))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the processes hung (killed after {limit_s} s); stderr so far: {logs}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


@pytest.mark.parametrize(
    ("n", "slow"),
    [
        # Alone, process 0 would pick b or c and process 1 a or c.
        (2, ["a", "b"]),
        pytest.param(4, ["a", "b", "a", ""], marks=pytest.mark.slow),
    ],
)
def test_every_process_ends_with_the_same_config(n, slow):
    # Imported here: importing kerneltune starts JAX's backend, which the workers (this
    # file run as a script) must not do before jax.distributed.initialize.
    from kerneltune._src.tuning.distributed import combine

    results = _launch(n, slow)
    assert [r["process"] for r in results] == list(range(n))
    for call in ("direct", "jit"):
        agreed = [r[call]["agreed"] for r in results]
        assert len(set(agreed)) == 1, (call, results)
        local = {r[call]["local"] for r in results}
        assert len(local) > 1, f"the test is moot: every process alone picked {local}"
        # The agreed config is the one the rule picks from every process's timings.
        published = {
            r["process"]: {
                "candidates": "same",
                "status": r[call]["status"],
                "time_s": r[call]["time_s"],
            }
            for r in results
        }
        winner = combine(published, TUNED_ORDER).winner
        assert agreed[0] == TUNED_ORDER[winner].variant, (call, results)
    assert all(r["verified"] for r in results), results


def test_a_process_that_never_arrives_makes_the_others_time_out():
    start = time.monotonic()
    results = _launch(2, ["", ""], mode="absent", env={"KERNELTUNE_AGREE_TIMEOUT": "0.5"})
    took = time.monotonic() - start
    waiting = results[0]
    for call in ("direct", "jit"):
        err = waiting[call]
        assert err["type"] == "AgreementTimeoutError" and err["is_timeout"], err
        assert err["missing"] == [1]
        assert "skew@v0" in err["message"] and "process(es) 1 of 2" in err["message"]
    assert results[1] == {"process": 1, "absent": True}
    assert took < 100


def _each_key_tuned_once_but_the_seed(results):
    """The keys of one family (the recorded sizes): the seed (the costliest) tuned by
    every process, each timing the heuristic and its slice of the other candidates;
    every other key by exactly one process. Returns the seed."""
    tuned = [set(map(tuple, r["tuned"])) for r in results]
    everything = set(map(tuple, results[0]["keys"]))
    assert len(everything) == len(SPLIT_SIZES)
    assert set().union(*tuned) == everything
    (seed,) = set.intersection(*tuned)
    alone = [t - {seed} for t in tuned]
    assert sum(len(t) for t in alone) == len(everything) - 1  # each other key once
    assert all(t for t in alone)  # every process had a share
    # The seed's candidates: the heuristic timed by all, each other by one process.
    timed = [dict((tuple(k), n) for k, n in r["timed"]) for r in results]
    assert sum(t[seed] - 1 for t in timed) == len(CANDIDATES) - 1
    return seed


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_offline_tuning_is_split_so_each_key_is_tuned_once(n):
    # Before: under jax.distributed every process tuned every recorded key (and agreed
    # on each); now each key is tuned by one process (the family's first by all
    # together, a slice of its candidates each) and every process ends with all.
    results = _launch(n, [""] * n, mode="split")
    everything = set(map(tuple, results[0]["keys"]))
    _each_key_tuned_once_but_the_seed(results)
    assert len({r["result"] for r in results}) == 1  # the identical full result
    assert all(r["entries"] == len(everything) and r["cached"] for r in results)


def test_a_seed_one_process_holds_cached_is_not_waited_for_and_its_config_is_everyones():
    # Process 1 holds the seed cached: it joins the seed's round without tuning (or
    # process 0 would wait for it until the timeout) and its config ends in every
    # process's cache, not only in the merged result.
    env = {"KT_TEST_PRECACHED": "1", "KERNELTUNE_AGREE_TIMEOUT": "40"}
    results = _launch(2, ["", ""], mode="split", env=env)
    tuned = [set(map(tuple, r["tuned"])) for r in results]
    assert not tuned[0] & tuned[1]  # the seed was tuned by process 0 alone
    assert len({r["result"] for r in results}) == 1
    assert results[0]["configs"] == results[1]["configs"]
    assert "b" in results[0]["configs"].values()  # process 1's cached seed config


@pytest.mark.parametrize("n", [2])
def test_autotune_of_a_function_ends_with_identical_configs_on_every_process(n):
    # `kt.autotune(f)` in a job: each key of f is tuned by one process, the results are
    # exchanged, and every process ends with the same full result, in its result and in
    # the default executor's cache, although alone each would pick differently
    # (KT_TEST_SLOW makes "c" and "a" dear on process 0: it picks "b"; process 1 "a").
    results = _launch(n, ["c,a", ""], mode="function")
    everything = set(map(tuple, results[0]["keys"]))
    _each_key_tuned_once_but_the_seed(results)
    assert len({r["result"] for r in results}) == 1  # the identical full result
    assert len({json.dumps(r["cached"], sort_keys=True) for r in results}) == 1
    assert len(results[0]["cached"]) == len(everything)
    # What each process would have picked alone differs: the agreement is not moot.
    assert [r["alone"] for r in results] == ["b", "a"]
    # Each process's winners were adopted by both (the whole function is faster with
    # the tuned configs on both: the heuristic "c" is dear everywhere).
    assert set(results[0]["cached"].values()) == {"a", "b"}


# -- the worker (one per process) ------------------------------------------------------


def _worker(pid: int, n: int, port: int, mode: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=n,
        process_id=pid,
        initialization_timeout=60,
    )
    import jax.numpy as jnp
    from jax import lax

    import kerneltune as kt
    from kerneltune._src.core.coordination import current_peers
    from kerneltune._src.workflows.verify import verify_agreement
    from tests.helpers import CostInProgram  # run as a script, with the root on the path

    class Skew(kt.Kernel):
        op_id = "skew"

        def run(self, x, *, cfg):
            slow = os.environ.get("KT_TEST_SLOW", "").split(",")
            reps = BASE[cfg.variant] * (SLOW if cfg.variant in slow else 1)
            with jax.named_scope(f"ktcost_{reps}"):  # what the cost timer reads
                return lax.fori_loop(0, reps, lambda i, y: jnp.tanh(y @ x), x)

        def heuristic_cfg(self, inv):
            return SkewCfg(variant="c")

        def candidate_cfgs(self, inv):
            return list(CANDIDATES)

    def executor():
        events = []
        # Costs read from the program, not the wall clock of a loaded machine (a 6x gap
        # inverted there once): each process's local winner is then what KT_TEST_SLOW
        # makes it.
        tuner = kt.Tuner(
            warmup=1, iters=5, top_k=0, validate=False, progress=False, max_workers=2,
            timer=CostInProgram(),
        )  # fmt: skip
        chain = kt.ConfigSelectorChain(
            kt.ConfigCache(), tuner=tuner, on_event=lambda event, **d: events.append((event, d))
        )
        return kt.Executor(chain), chain, events

    def outcome(chain, events):
        (cfg,) = [chain.cache.get(*k) for k in chain.cache.keys()]
        (timings,) = [d["timings"] for e, d in events if e == "autotune_finish"]
        local = min((t, c.variant) for c, t, status in timings if status == "ok")[1]
        return {
            "agreed": cfg.variant,
            "local": local,
            "time_s": [t for _, t, _ in timings],
            "status": [status for _, _, status in timings],
        }

    x = jax.random.normal(jax.random.key(0), (SIZE, SIZE), jnp.float32) / SIZE
    kernel = Skew()
    result: dict = {"process": pid}
    if mode == "split":
        from kerneltune._src.kernel import recording

        heuristics = kt.Executor(
            kt.ConfigSelectorChain(
                kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
            )
        )
        with recording.record_calls():
            for size in SPLIT_SIZES:
                heuristics(kernel, jnp.ones((size, size)) / size)
        ex, chain, events = executor()
        if os.environ.get("KT_TEST_PRECACHED") == str(pid):
            # This process holds the seed (the largest call) cached already.
            from kerneltune._src.core.devices import device_fingerprint

            (seed,) = [
                r
                for r in recording.iter_records(recording.get_invocations())
                if r.args[0].shape[0] == max(SPLIT_SIZES)
            ]
            chain.cache.put(device_fingerprint(), *seed.key, SkewCfg(variant="b"))
        tuned = kt.autotune_recorded(selector=chain)
        result["keys"] = sorted(r.key for r in recording.iter_records(recording.get_invocations()))
        result["tuned"] = sorted(
            (d["op_id"], d["call_key"]) for e, d in events if e == "autotune_start"
        )
        result["timed"] = [
            ((d["op_id"], d["call_key"]), d["timed"]) for e, d in events if e == "autotune_start"
        ]
        # The entries as JSON (the export's own time stamp aside).
        result["result"] = json.dumps(json.loads(tuned.dumps())["entries"], sort_keys=True)
        result["entries"] = len(tuned)
        # Every key's config is in this process's memory cache, typed.
        result["cached"] = all(
            isinstance(chain.cache.get(tuned.device, e.op_id_v, e.call_key), SkewCfg) for e in tuned
        )
        result["configs"] = {
            e.call_key: chain.cache.get(tuned.device, e.op_id_v, e.call_key).variant for e in tuned
        }
    elif mode == "function":
        ex, chain, events = executor()
        kt.set_default_executor(ex)  # `kt.autotune(f)` tunes into the default executor
        xs = [jnp.ones((size, size)) / size for size in SPLIT_SIZES]

        def f(*xs):
            return sum(jnp.sum(kernel(x)) for x in xs)

        tuned = kt.autotune(f, *xs)
        result["keys"] = sorted((e.op_id_v, e.call_key) for e in tuned)
        result["tuned"] = sorted(
            (d["op_id"], d["call_key"]) for e, d in events if e == "autotune_start"
        )
        result["timed"] = [
            ((d["op_id"], d["call_key"]), d["timed"]) for e, d in events if e == "autotune_start"
        ]
        result["result"] = json.dumps(json.loads(tuned.dumps())["entries"], sort_keys=True)
        result["cached"] = {
            e.call_key: chain.cache.get(tuned.device, e.op_id_v, e.call_key).variant for e in tuned
        }
        # This process alone, on one key: its own winner (a fresh selector, no peers).
        from kerneltune._src.tuning.distributed import tuning_alone

        with tuning_alone():
            alone = kt.autotune(kernel, x, tuner=kt.Tuner(
                warmup=1, iters=3, top_k=0, validate=False, progress=False,
                timer=CostInProgram(),
            ))  # fmt: skip
        result["alone"] = alone.variant
    elif mode == "absent":
        client = current_peers().client
        if pid == n - 1:
            # Never makes the call; stays up until the others are done.
            client.blocking_key_value_get("kt-test/done", 120_000)
            result["absent"] = True
        else:
            for call in ("direct", "jit"):
                ex, _, _ = executor()
                try:
                    if call == "direct":
                        ex(kernel, x)
                    else:
                        jax.jit(lambda a, ex=ex: ex(kernel, a))(x)
                    result[call] = {"type": None}
                except Exception as e:
                    result[call] = {
                        "type": type(e).__name__,
                        "is_timeout": isinstance(e, TimeoutError),
                        "missing": list(getattr(e, "missing", ())),
                        "message": str(e),
                    }
            client.key_value_set("kt-test/done", "1")
    else:
        ex, chain, events = executor()
        ex(kernel, x).block_until_ready()
        result["direct"] = outcome(chain, events)
        # A fresh selector tunes the same key again (a second round), inside a trace.
        jex, jchain, jevents = executor()
        jax.jit(lambda a: jex(kernel, a))(x).block_until_ready()
        result["jit"] = outcome(jchain, jevents)
        result["verified"] = verify_agreement(chain).ok and verify_agreement(jchain).ok
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
