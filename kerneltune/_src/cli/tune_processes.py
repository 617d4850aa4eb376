"""`kerneltune tune` in processes of its own: `--workers N` (one per GPU, joined as one
JAX job) and `--isolate` (workers that may crash or hang), and what every worker is
told."""

from __future__ import annotations

import argparse
from typing import Any

from kerneltune._src.cli.errors import CommandError
from kerneltune._src.workflows import tune_workers


def run_workers(args: argparse.Namespace, records: list[Any], count: int, gpus: list[str]) -> int:
    """`--workers N`: tunes `records` in N processes of one JAX job and merges their
    results."""
    from kerneltune._src.cli.cache_commands import print_table
    from kerneltune._src.workflows import split

    print(
        f"tuning in {count} worker processes"
        + (f" on GPUs {', '.join(gpus[:count])}" if gpus else "")
    )
    plans = split.plans_for(records, count)
    result, runs = tune_workers.run_workers(records, plans, worker_command(args), gpus=gpus)
    print_table(
        ["worker", "gpu", "keys together", "keys alone", "with a config", "exit"],
        [_worker_row(r) for r in runs],
    )
    have = {(e.op_id_v, e.call_key) for e in result} if result is not None else set()
    failed = False
    for r in runs:
        if r.stopped:
            print(
                f"worker {r.index} stopped: its keys were done, and the job could not "
                "finish without the worker that failed"
            )
        elif r.returncode != 0:
            failed = True
            tail = "\n".join(r.log.strip().splitlines()[-5:])
            print(f"worker {r.index} exited with {r.returncode}; last lines:\n{tail}")
        for record in r.alone:
            if record.key not in have:
                failed = True
                print(f"worker {r.index}: no config for {record.op_id_v} {record.signature}")
    for record in plans[0].seeds if plans else ():
        if record.key not in have:
            failed = True
            print(f"all workers: no config for {record.op_id_v} {record.signature}")
    save_merged(args, result, len(records))
    return 1 if failed else 0


def _worker_row(r: Any) -> list[str]:
    exit_text = "stopped" if r.stopped else str(r.returncode)
    cells = (r.index, r.gpu or "-", len(r.together), len(r.alone), len(r.finished), exit_text)
    return [str(c) for c in cells]


def join_job(args: argparse.Namespace) -> None:
    """A `--workers` worker: joins its siblings' JAX job before anything starts JAX."""
    import jax

    try:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.processes,
            process_id=args.process_id,
            initialization_timeout=120,
        )
    except Exception as e:  # a worker that cannot join must say why, not hang its parent
        where = f"worker {args.process_id}: cannot join the job at {args.coordinator}"
        raise CommandError(f"{where}: {e}") from None


def run_isolated(args: argparse.Namespace, records: list[Any]) -> int:
    """`--isolate`: tunes `records` in worker processes that may crash or hang."""
    from kerneltune._src.cli.cache_commands import cfg_text
    from kerneltune._src.workflows import isolation

    print("tuning in an isolated worker process")
    result, culprits, code = isolation.tune_isolated(
        records, worker_command(args), run_timeout_s=args.run_timeout
    )
    for c in culprits:
        what = f"candidate {cfg_text(c.cfg)}" if c.cfg else "the key"
        print(f"{c.op_id_v} {c.call_key[:12]}: {what} was dropped: {c.reason}")
    save_merged(args, result, len(records))
    lost_keys = any(not c.cfg for c in culprits)
    return 1 if code or lost_keys else 0


def worker_command(args: argparse.Namespace) -> Any:
    """What this command's worker processes are told (`--workers`, `--isolate`)."""
    return tune_workers.WorkerCommand(
        manifest=args.manifest,
        imports=tuple(args.imports),
        cache_dir=getattr(args, "cache_dir", None),
        op=args.op,
        force=args.force,
    )


def wrote_line(result: Any, out: str) -> str:
    """What `--out` received: the result's configs, the untuned ones (a call with nothing
    to tune keeps its heuristic config, which an import never stores) counted apart."""
    untuned = sum(1 for e in result if e.untuned)
    n = len(result)
    return (
        f"wrote {n} config{'' if n == 1 else 's'} to {out} ({n - untuned} tuned, {untuned} untuned)"
    )


def save_merged(args: argparse.Namespace, result: Any, total: int) -> None:
    """Says how many calls got a config and writes them to `--out`."""
    tuned = len(result) if result is not None else 0
    print(f"{tuned} of {total} calls have a config")
    if args.out and result is not None:
        result.save(args.out)
        print(wrote_line(result, args.out))
