"""A benchmark's child run in a fresh process: what first-call figures need, so that no
variant inherits another's warm-up (imports, JAX's caches, XLA's autotuning results)
or kerneltune's tuned configs."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

#: Where `python -m benchmarks.<script>` imports from.
ROOT = pathlib.Path(__file__).resolve().parent.parent


def json_result(
    cmd: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The last JSON line `cmd` prints, run from the repository root with an empty
    kerneltune cache directory (`KERNELTUNE_CACHE_DIR`: nothing tuned before) and the
    variables `env` adds; `{"error": ...}` where it runs past `timeout_s` or prints no
    JSON line (the error then ends with the last line of its stderr)."""
    with tempfile.TemporaryDirectory() as cache_dir:
        full = {**os.environ, "KERNELTUNE_CACHE_DIR": cache_dir, **(env or {})}
        try:
            done = subprocess.run(
                list(cmd), env=full, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return {"error": f"no result after {timeout_s:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"rc {done.returncode}: {tail[:200]}"}
