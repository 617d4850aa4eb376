"""Independent processes that miss the same key at once agree on one config: each
publishes create-exclusive and adopts the entry already on disk (issue 12, item 8).

The worker processes run this file as a script, so they share `Cfg` with the test."""

import dataclasses
import os
import subprocess
import sys

from kerneltune._src.caching.persistent import PersistentCache
from tests.helpers import ROOT

DEV, OP, KEY = "cpu|cpu", "race@v1", "same-key"
PROCESSES = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cfg:
    winner: int


def _worker(path: str, me: int) -> None:
    cache = PersistentCache(path, fsync=False)
    print("ready", flush=True)
    sys.stdin.readline()  # all start publishing at once
    used = cache.put(DEV, OP, KEY, Cfg(winner=me), exclusive=True)
    print(f"used {used.winner}", flush=True)


def test_eight_processes_end_with_one_config(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(tmp_path), str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for i in range(PROCESSES)
    ]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    used = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        used.add(out.strip())
    (line,) = used
    on_disk = PersistentCache(tmp_path).get(DEV, OP, KEY, Cfg)
    assert line == f"used {on_disk.winner}"


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]))
