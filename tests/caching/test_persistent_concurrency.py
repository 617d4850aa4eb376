"""The persistent cache with many writers: processes and threads writing at once, writers
killed in the middle of a burst of puts, and a second process reading the same type.

The worker processes run this file as a script (`python test_persistent_concurrency.py
ROLE ...`, see `_worker_main`), so that they share `Cfg` and `value_for` with the tests.
"""

import dataclasses
import json
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from kerneltune._src.caching.cache_entry import entry_from_document
from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.tuning.report import CandidateResult, TuningReport
from tests.helpers import ROOT

DEV = "cpu|cpu"
OP = "burst@v1"
NUM_SHARED = 25
NUM_CANDIDATES = 30


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cfg:
    writer: int
    index: int
    block: tuple[int, ...]
    scale: float
    name: str
    flag: bool
    stages: int | None


def value_for(writer: int, index: int) -> Cfg:
    return Cfg(
        writer=writer,
        index=index,
        block=(16 * (index % 8 + 1), writer + 1, index),
        scale=index / 7 + writer,
        name=f"w{writer}-i{index}",
        flag=index % 2 == 0,
        stages=None if index % 3 == 0 else index % 5,
    )


def report_for(cfg: Cfg) -> TuningReport:
    candidates = tuple(
        CandidateResult(
            cfg=dataclasses.replace(cfg, stages=j),
            time_s=1e-3 * (j + 1),
            samples_s=tuple(1e-3 * (j + 1) + 1e-6 * s for s in range(10)),
        )
        for j in range(NUM_CANDIDATES)
    )
    return TuningReport(best=cfg, candidates=candidates, timer="wallclock")


def op_of(writer: int) -> str:
    return f"op{writer % 3}@v1"


# --- worker processes -----------------------------------------------------------------


def _wait_for_go() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def _worker_main(role: str, path: str, *args: str) -> None:
    cache = PersistentCache(path)
    if role == "writer":
        writer, count = int(args[0]), int(args[1])
        _wait_for_go()
        for i in range(count):
            cache.put(DEV, op_of(writer), f"w{writer}-k{i}", value_for(writer, i))
            if i % 8 == 0:
                shared = i // 8 % NUM_SHARED
                cache.put(DEV, OP, f"shared{shared}", value_for(writer, 10_000 + shared))
        print("done", flush=True)
    elif role == "exchange":
        got = cache.get(DEV, OP, "from-parent", Cfg)
        print(f"{type(got).__qualname__} {got == value_for(5, 9)} {got!r}", flush=True)
        cache.put(DEV, OP, "from-child", value_for(3, 7), report=report_for(value_for(3, 7)))
    else:
        raise SystemExit(f"unknown role {role!r}")


def _burst(path: str, writer: int, started) -> None:
    """Puts entries with big reports into the shared keys until it is killed."""
    cache = PersistentCache(path)
    rng = random.Random(writer)
    for round_ in range(10**9):
        key = rng.randrange(NUM_SHARED)
        cfg = value_for(writer, round_ * NUM_SHARED + key)
        cache.put(DEV, OP, f"shared{key}", cfg, report=report_for(cfg))
        started.set()


def _spawn(role: str, path, *args, stderr=subprocess.PIPE) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), role, str(path), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
        cwd=ROOT,
    )


def _await_ready(procs) -> None:
    for proc in procs:
        line = proc.stdout.readline()
        if line != "ready\n":
            proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"worker did not start: {line!r} {err}")


def _go(procs) -> None:
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _finish(procs) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _kerneltune_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "kerneltune"]


def _temporaries(path):
    return [n for _, _, names in os.walk(path) for n in names if n.endswith(".tmp")]


def _check_all_written(cache, num_writers: int, count: int) -> None:
    for writer in range(num_writers):
        for i in range(count):
            got = cache.get(DEV, op_of(writer), f"w{writer}-k{i}", Cfg)
            assert type(got) is Cfg, (writer, i, got)
            assert got == value_for(writer, i)
    for shared in range(NUM_SHARED):
        got = cache.get(DEV, OP, f"shared{shared}", Cfg)
        assert got is not None and got.index == 10_000 + shared
        assert got == value_for(got.writer, got.index)  # one writer's value, whole
    assert len(cache) == num_writers * count + NUM_SHARED


# --- tests --------------------------------------------------------------------------------


@pytest.mark.slow
def test_eight_processes_write_at_once(tmp_path, caplog):
    path, num_writers, count = tmp_path / "cache", 8, 200
    procs = [_spawn("writer", path, w, count) for w in range(num_writers)]
    try:
        _await_ready(procs)
        _go(procs)  # all are started and imported: they now write at the same time
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and out == "done\n", err
    finally:
        _finish(procs)
    _check_all_written(PersistentCache(path), num_writers, count)
    assert not _temporaries(path)
    assert not _kerneltune_warnings(caplog)


def test_eight_threads_write_at_once(tmp_path, caplog):
    path, num_writers, count = tmp_path / "cache", 8, 200
    cache = PersistentCache(path)
    barrier = threading.Barrier(num_writers)
    errors = []

    def write(writer: int) -> None:
        try:
            barrier.wait()
            for i in range(count):
                cache.put(DEV, op_of(writer), f"w{writer}-k{i}", value_for(writer, i))
                if i % 8 == 0:
                    shared = i // 8 % NUM_SHARED
                    cache.put(DEV, OP, f"shared{shared}", value_for(writer, 10_000 + shared))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(num_writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    _check_all_written(cache, num_writers, count)
    _check_all_written(PersistentCache(path), num_writers, count)
    assert not _temporaries(path)
    assert not _kerneltune_warnings(caplog)


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL and a fork server")
def test_writers_killed_mid_burst_never_leave_partial_entries(tmp_path, caplog):
    path = tmp_path / "cache"
    entries_dir = path / "configs"
    reader_cache = PersistentCache(path)
    stop = threading.Event()
    problems: list[str] = []
    seen = {"entries": 0, "files": 0}

    def check_entry(key: str, entry, cfg) -> None:
        if cfg != value_for(cfg.writer, cfg.index) or entry.call_key != key:
            problems.append(f"{key}: mixed or wrong value {cfg!r}")
        if len(entry.candidates) != NUM_CANDIDATES:
            problems.append(f"{key}: {len(entry.candidates)} candidates")
        seen["entries"] += 1

    def read_continuously() -> None:
        while not stop.is_set():
            for shared in range(NUM_SHARED):
                key = f"shared{shared}"
                entry = reader_cache.get_entry(DEV, OP, key, cfg_type=Cfg)
                if entry is not None:
                    check_entry(key, entry, reader_cache.get(DEV, OP, key, Cfg))
            # Also read the files straight from the directory, as a listing sees them.
            for dirpath, _, names in os.walk(entries_dir):
                for name in names:
                    if name.endswith(".json") and not name.startswith("."):
                        with open(os.path.join(dirpath, name), "rb") as f:
                            data = f.read()
                        try:
                            entry_from_document(json.loads(data), name)
                        except Exception as e:
                            problems.append(f"{name}: partial file ({e}): {data[:80]!r}")
                        seen["files"] += 1
            time.sleep(0.001)

    # Writers are forked from a server that has imported kerneltune once: starting 20
    # fresh interpreters would take most of this test's time.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["kerneltune._src.caching.persistent", __name__])
    reader = threading.Thread(target=read_continuously)
    reader.start()
    rng = random.Random(1)
    kills = 0
    try:
        for wave in range(5):
            started = [ctx.Event() for _ in range(4)]
            procs = [
                ctx.Process(target=_burst, args=(str(path), wave * 4 + i, started[i]))
                for i in range(4)
            ]
            try:
                for proc in procs:
                    proc.start()
                for event in started:
                    assert event.wait(timeout=60), "a writer did not start"
                for proc in procs:
                    time.sleep(rng.uniform(0.0, 0.08))
                    assert proc.is_alive()
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.join(timeout=30)
                    assert proc.exitcode == -signal.SIGKILL
                    kills += 1
            finally:
                for proc in procs:
                    proc.kill()
                    proc.join()
                    proc.close()
    finally:
        stop.set()
        reader.join()

    assert kills == 20
    assert not problems, problems[:5]
    assert seen["entries"] > 0 and seen["files"] > 0
    # The cache is readable after all that: every entry whole, nothing to warn about.
    cache = PersistentCache(path)
    entries = list(cache.entries())
    assert 0 < len(entries) == len(cache) <= NUM_SHARED
    for entry in entries:
        cfg = cache.get(DEV, OP, entry.call_key, Cfg)
        assert cfg == value_for(cfg.writer, cfg.index)
    assert not _kerneltune_warnings(caplog)
    # About half the kills land inside a write (its temporary file is left behind):
    # those are the moments a torn entry could have appeared. They are pruned once old.
    assert _temporaries(path), "no writer was killed in the middle of a write"
    cache.prune(temp_older_than_s=0)
    assert not _temporaries(path)
    assert len(cache) == len(entries)


def test_a_second_process_gets_the_same_type(tmp_path, caplog):
    path = tmp_path / "cache"
    cache = PersistentCache(path)
    cache.put(DEV, OP, "from-parent", value_for(5, 9))
    proc = _spawn("exchange", path)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        _finish([proc])
    assert proc.returncode == 0, err
    assert out == f"Cfg True {value_for(5, 9)!r}\n"

    got = cache.get(DEV, OP, "from-child", Cfg)
    assert type(got) is Cfg and got == value_for(3, 7)
    assert isinstance(got.block, tuple) and isinstance(got.scale, float)
    entry = cache.get_entry(DEV, OP, "from-child")
    assert len(entry.candidates) == NUM_CANDIDATES and entry.timer == "wallclock"
    assert not _kerneltune_warnings(caplog)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    _worker_main(*sys.argv[1:])
