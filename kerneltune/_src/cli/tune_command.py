"""`kerneltune tune MANIFEST [--shard i/n] [--out FILE] [--import MODULE]`: tune a manifest.

The records are sorted by (op, call key) and dealt round-robin to `n` shards, so that
`--shard 0/n` ... `--shard n-1/n` on n machines cover the manifest exactly once. Each
run writes its winners to the persistent cache (`--cache-dir`, else the default one)
and, with `--out`, to a result file that `kerneltune cache import FILE` or
`kerneltune cache merge FILE` adds to any cache, and that `AutotuningResult.load` reads.

Importing this module is cheap (the `kerneltune` command's parser imports it); the
heavy imports happen when the command runs.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from kerneltune._src.cli import tune_processes
from kerneltune._src.cli.errors import CommandError
from kerneltune._src.workflows import tune_workers


def parse_shard(text: str) -> tuple[int, int]:
    """`"i/n"` as `(i, n)` with `0 <= i < n`.

    Example:
      >>> parse_shard("1/4")
      (1, 4)
    """
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not sep or n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"expected i/n with 0 <= i < n (e.g. 0/4), got {text!r}")
    return i, n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declares `kerneltune tune`'s arguments."""
    parser.description = (
        "Tune the calls recorded in a manifest. A manifest is data: it names kernels, "
        "and kerneltune looks them up among the kernel classes defined in this process "
        "(a Kernel subclass registers itself when its class is defined). Nothing named "
        "inside the file is imported or called, also not with --dry-run: name the "
        "modules that define your kernels with --import (kerneltune's bundled kernels "
        "are always available)."
    )
    parser.add_argument("manifest", help="a manifest written by kerneltune.save_manifest")
    add_import_argument(parser, "manifests never name code to import")
    parser.add_argument(
        "--shard",
        type=parse_shard,
        default=(0, 1),
        metavar="i/n",
        help="tune only shard i of n (0-based); the n shards cover the manifest exactly once",
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tune in N worker processes, one per GPU, joined as one JAX job: each "
        "family's costliest key tuned by all of them together, the others dealt by "
        "estimated cost; results merged (default: one per visible GPU; 1 without GPUs)",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="also write the tuned configs to FILE (JSON), rewritten after every key so "
        "that an interrupted run keeps what finished",
    )
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="tune in a worker process: a candidate that crashes it (segfault, illegal "
        "memory access) or hangs is recorded with its reason, and a new worker goes on "
        "without it",
    )
    parser.add_argument(
        "--run-timeout",
        type=_positive_float,
        default=None,
        metavar="S",
        help="a candidate's first run may take S seconds, then it is abandoned (with "
        "--isolate: its worker is killed); default: 100x the heuristic config's first "
        "run, at least 10 s, and 60 s before the heuristic ran",
    )
    # A worker of `--workers` tunes exactly the keys its parent dealt it; one of
    # `--isolate` also keeps a journal and skips the candidates its parent names.
    parser.add_argument("--keys", metavar="FILE", help=argparse.SUPPRESS)
    # A worker of `--workers` joins its siblings' JAX job (`jax.distributed`).
    parser.add_argument("--coordinator", metavar="HOST:PORT", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=_positive_int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--journal", metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--exclude", metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--op", help='only this op: "matmul" (any version) or "matmul@v1"')
    parser.add_argument(
        "--force", action="store_true", help="benchmark again even when a tuned config is cached"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list this shard's calls without tuning"
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="never show a progress bar (default: only on a terminal)",
    )


def add_import_argument(parser: argparse.ArgumentParser, why: str) -> None:
    """`--import MODULE` (repeatable): modules that define the user's kernels."""
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, so that the kernels it defines can be found (repeat "
        f"for several modules); {why}",
    )


def shard_records(records: list[Any], index: int, count: int) -> list[Any]:
    """Shard `index` of `count` of `records` (sorted by (op, call key) first)."""
    ordered = sorted(records, key=lambda r: (r.op_id_v, r.call_key))
    return ordered[index::count]


def run(args: argparse.Namespace) -> int:
    """Runs `kerneltune tune`; returns the exit status (1 when a call failed)."""
    from kerneltune._src.caching import manifest
    from kerneltune._src.caching.cache_entry import op_matches
    from kerneltune._src.cli.cache_commands import cfg_text, format_time, print_table
    from kerneltune._src.kernel import recording
    from kerneltune._src.workflows import offline

    if args.coordinator:
        tune_processes.join_job(args)
    _import_kernels(args.imports)
    try:
        loaded = manifest.load_manifest(args.manifest)
    except (OSError, ValueError) as e:
        raise CommandError(f"cannot read the manifest {args.manifest}: {e}") from None
    records = recording.iter_records(loaded)
    if args.op:
        records = [r for r in records if op_matches(r.op_id_v, args.op)]
    index, count = args.shard
    mine = shard_records(records, index, count)
    if args.keys:
        try:
            wanted = tune_workers.read_keys(args.keys)
        except (OSError, ValueError) as e:
            raise CommandError(f"cannot read --keys {args.keys}: {e}") from None
        mine = [r for r in mine if (r.op_id_v, r.call_key) in wanted]
    where = f"shard {index}/{count}: " if count > 1 else ""
    print(f"{where}{len(mine)} of {len(records)} recorded calls in {args.manifest}")
    if args.dry_run:
        print_table(["op", "shapes", "key"], [[r.op_id_v, r.signature, r.call_key] for r in mine])
        return 0

    if args.journal:
        _start_journal(args)
    elif args.isolate and not args.keys:
        return tune_processes.run_isolated(args, mine)
    gpus = tune_workers.visible_gpus()
    workers = args.workers if args.workers is not None else max(len(gpus), 1)
    if gpus and workers > len(gpus):
        # Measured on an H100: a second process on the same GPU failed for want of
        # memory (each preallocates most of it), and would disturb the other's timings.
        print(
            f"--workers {workers}: only {len(gpus)} visible GPU(s), and workers sharing a "
            f"GPU would contend for its memory and skew each other's timings; tuning in "
            f"{len(gpus)} worker(s)."
        )
        workers = len(gpus)
    if workers > 1 and not args.keys:
        return tune_processes.run_workers(args, mine, min(workers, max(len(mine), 1)), gpus)

    selector = _selector(args)
    location = getattr(selector.persistent, "location", None)
    done: list[Any] = []

    def save_so_far(outcome: Any) -> None:
        done.append(outcome)
        if args.out:
            offline.result_of(done).save(args.out)

    outcomes = offline.tune_records(
        mine,
        selector,
        force=args.force,
        progress=False if args.no_progress else None,
        on_outcome=save_so_far,
    )
    rows = []
    for o in outcomes:
        entry = o.entry
        timings = entry.timings if entry is not None else ()
        ok_candidates = sum(1 for t in timings if t.get("status") == "ok")
        rows.append(
            [
                o.record.op_id_v,
                _shorten(o.record.signature, 40),
                f"{ok_candidates}/{len(timings)}" if timings else "-",
                format_time(entry.heuristic_time_s if entry is not None else None),
                format_time(entry.best_time_s if entry is not None else None),
                f"{entry.speedup:.2f}x" if entry is not None and entry.speedup else "-",
                _shorten(cfg_text(entry.cfg), 40) if entry is not None else "-",
                o.status if o.error is None else f"{o.status}: {_shorten(o.error, 60)}",
            ]
        )
    print_table(
        ["op", "shapes", "ok/tried", "heuristic", "best", "speedup", "winner", "status"], rows
    )
    counts = {
        s: sum(1 for o in outcomes if o.status == s)
        for s in ("tuned", "cached", "untuned", "failed")
    }
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing to tune")
    if location is not None:
        print(f"persistent cache: {location}")
    if args.out:
        result = offline.result_of(outcomes)
        result.save(args.out)
        print(tune_processes.wrote_line(result, args.out))
    return 1 if counts["failed"] else 0


def _start_journal(args: argparse.Namespace) -> None:
    from kerneltune._src.core import files
    from kerneltune._src.tuning import journal

    excluded: Any = {}
    if args.exclude:
        try:
            excluded = files.read_json(args.exclude)
        except (OSError, ValueError) as e:
            raise CommandError(f"cannot read --exclude {args.exclude}: {e}") from None
    journal.configure(args.journal, excluded=excluded)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _import_kernels(modules: list[str]) -> None:
    """Imports the bundled kernels and the modules the user named, and lets manifests
    name values (enums, functions) from those modules."""
    from kerneltune._src.kernel import recording

    for name in ["kerneltune.kernels", *modules]:
        try:
            importlib.import_module(name)
        except Exception as e:  # the user's module: report it as one line
            raise CommandError(f"--import {name}: {type(e).__name__}: {e}") from None
        recording.trust_module(name)


def _selector(args: argparse.Namespace) -> Any:
    from kerneltune._src.caching.cache import ConfigCache
    from kerneltune._src.caching.default_cache import default_persistent_cache
    from kerneltune._src.caching.persistent import PersistentCache
    from kerneltune._src.core import options
    from kerneltune._src.selection.chain import AutotunePolicy, ConfigSelectorChain
    from kerneltune._src.tuning.tuner import Tuner

    cache_dir = getattr(args, "cache_dir", None)
    if cache_dir == "":
        raise CommandError("--cache-dir is empty; give a directory or a URL.")
    persistent: PersistentCache[Any] | None
    try:
        if cache_dir:
            persistent = PersistentCache(cache_dir, readonly=options.CACHE_READONLY.value)
        else:
            persistent = default_persistent_cache()
    except ValueError as e:
        raise CommandError(str(e)) from None
    run_timeout = getattr(args, "run_timeout", None)  # `explain --tune` has none
    tuner: Tuner | None = Tuner(run_timeout_s=run_timeout) if run_timeout else None
    return ConfigSelectorChain(
        ConfigCache(), policy=AutotunePolicy(), persistent=persistent, tuner=tuner
    )


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
