"""`kerneltune tune --isolate`: tuning in a worker process that a crash or a hang of
one candidate cannot take down with the job.

The worker writes a journal (`tuning/journal.py`): which key and candidate it is about
to run, since when, and for how long that may take. This parent waits for the worker;
when it dies while a candidate runs, or a candidate's first run overruns its bound (then
the parent kills it), that candidate is recorded with the reason, and a new worker
tunes the keys not yet finished, skipping every candidate recorded so far (reported
with its reason in the tuning's results). What finished is never redone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from kerneltune._src.caching import manifest as manifests
from kerneltune._src.tuning import journal
from kerneltune._src.workflows import tune_workers

logger = logging.getLogger("kerneltune")

#: How often the parent looks at the worker and its journal (seconds).
POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class Culprit:
    """A candidate that took its worker down."""

    op_id_v: str
    call_key: str
    cfg: dict[str, Any]
    reason: str


def tune_isolated(
    records: Sequence[Any],
    command: tune_workers.WorkerCommand,
    *,
    run_timeout_s: float | None = None,
    gpu: str | None = None,
    quiet: bool = False,
    python_path: Sequence[str] = (),
) -> tuple[Any, list[Culprit], int]:
    """Tunes `records` in worker processes, one after another, until every key has an
    outcome.

    Returns:
      `(result, culprits, exit)`: the merged `AutotuningResult` (None when nothing
      finished), the candidates that crashed or hung a worker, and the last worker's
      exit status.
    """
    from kerneltune._src.caching.result import AutotuningResult

    remaining = list(records)
    culprits: list[Culprit] = []
    results: list[Any] = []
    code = 0
    with tempfile.TemporaryDirectory(prefix="kerneltune-isolated-") as tmp:
        # Each crash excludes one more candidate; a worker that dies outside any
        # candidate gives up its current key. So this ends.
        for attempt in range(len(records) * 64 + 1):
            if not remaining:
                break
            paths = {
                n: os.path.join(tmp, f"{n}{attempt}.json")
                for n in ("keys", "out", "journal", "exclude")
            }
            tune_workers.write_keys(paths["keys"], remaining)
            with open(paths["exclude"], "w") as f:
                json.dump(journal.excluded_doc([_as_item(c) for c in culprits]), f)
            argv = command.argv(
                paths["keys"], paths["out"], "--journal", paths["journal"],
                "--exclude", paths["exclude"],
                *(["--run-timeout", str(run_timeout_s)] if run_timeout_s is not None else []),
            )  # fmt: skip
            env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}))
            if python_path:
                env["PYTHONPATH"] = os.pathsep.join([*python_path, env.get("PYTHONPATH", "")])
            sys.stdout.flush()  # the worker prints its own progress and table here
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL if quiet else None)
            code, hung = _wait(proc, paths["journal"])
            finished = tune_workers.load_result(paths["out"])
            if finished is not None:
                results.append(finished)
            done = {(e.op_id_v, e.call_key) for e in finished} if finished is not None else set()
            if hung is None and code in (0, 1):
                break  # it ended by itself: every key has an outcome (1: some failed)
            remaining = [r for r in remaining if (r.op_id_v, r.call_key) not in done]
            running = hung or journal.read_running(paths["journal"])
            if running is None:
                # It died between candidates' runs: the key it was on cannot be tuned.
                if remaining:
                    lost = remaining.pop(0)
                    why = f"the worker process died while tuning this key (exit {code})"
                    culprits.append(Culprit(lost.op_id_v, lost.call_key, {}, why))
                continue
            reason = (
                f"its first run took more than {running['bound_s']:.0f} s; the worker was killed"
                if hung is not None
                else f"the worker process died while it ran (exit {code})"
            )
            culprits.append(Culprit(running["op_id"], running["call_key"], running["cfg"], reason))
    merged = None
    for result in results:
        merged = result if merged is None else merged | result
    if merged is not None and not isinstance(merged, AutotuningResult):
        merged = None
    return merged, culprits, code if code in (0, 1) else 1


def autotune_isolated(
    records: Sequence[Any],
    *,
    persistent_location: str | None,
    force: bool = False,
    run_timeout_s: float | None = None,
) -> Any:
    """`autotune_recorded(..., isolate=True)`: tunes `records` in isolated worker
    processes (as `kerneltune tune --isolate` does) and returns their
    `AutotuningResult`. The workers write winners to `persistent_location` (when None,
    to a temporary cache: apply the result with `with result:`).

    Raises:
      ValueError: a record's kernel is not defined in an importable module (a worker
        imports the modules that define the records' kernels, and nothing else).
    """
    from kerneltune._src.caching.result import AutotuningResult

    modules = set()
    for r in records:
        module = r.ref.target.partition(":")[0] if r.ref is not None else "__main__"
        if module == "__main__":
            raise ValueError(
                f"isolate=True cannot tune {r.op_id_v}: its kernel class is not defined in "
                "an importable module (a script's own classes cannot be rebuilt in a worker "
                "process). Move the kernel into a module."
            )
        modules.add(module)
    with tempfile.TemporaryDirectory(prefix="kerneltune-isolated-") as tmp:
        path = os.path.join(tmp, "manifest.json")
        manifests.save_manifest(path, list(records))
        command = tune_workers.WorkerCommand(
            manifest=path,
            imports=sorted(modules),
            cache_dir=persistent_location or os.path.join(tmp, "cache"),
            force=force,
        )
        result, culprits, _ = tune_isolated(
            records,
            command,
            run_timeout_s=run_timeout_s,
            quiet=True,
            # The worker imports the kernels' modules from where this process found them.
            python_path=[p for p in sys.path if p and os.path.isdir(p)],
        )
    for c in culprits:
        what = f"candidate {c.cfg}" if c.cfg else "the whole key"
        logger.warning("Isolated tuning of %s dropped %s: %s", c.op_id_v, what, c.reason)
    if result is None:
        device = records[0].device if records else ""
        return AutotuningResult(device)
    return result


def _wait(proc: subprocess.Popen[bytes], journal_path: str) -> tuple[int, dict[str, Any] | None]:
    """Waits for the worker; kills it when a candidate's first run overruns its bound.
    Returns its exit status and, for a hang, the journal entry of the candidate."""
    while True:
        try:
            return proc.wait(timeout=POLL_S), None
        except subprocess.TimeoutExpired:
            pass
        running = journal.read_running(journal_path)
        if running is not None and time.time() - running["since"] > running["bound_s"]:
            proc.kill()
            return proc.wait(), running


def _as_item(c: Culprit) -> dict[str, Any]:
    return {"op_id": c.op_id_v, "call_key": c.call_key, "cfg": c.cfg, "reason": c.reason}
