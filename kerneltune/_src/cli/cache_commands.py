"""`kerneltune info` and `kerneltune cache ...`: what the command line does with the
persistent cache (the argument declarations are in `main.py`)."""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kerneltune._src.caching.cache_entry import CacheEntry, op_matches, runtime_versions
from kerneltune._src.caching.persistent import PersistentCache, default_cache_dir
from kerneltune._src.cli.errors import CommandError
from kerneltune._src.core import options
from kerneltune._src.kernel.backends import served_op_ids
from kerneltune._src.kernel.base import registered_kernels
from kerneltune._src.tuning.report import format_seconds


def _open(args: argparse.Namespace) -> PersistentCache[Any]:
    if args.cache_dir == "":
        # An empty value must never fall back to the default cache (`clear` would
        # empty the user's real cache).
        raise CommandError("--cache-dir is empty; give a directory or a URL.")
    try:
        readonly = options.CACHE_READONLY.value
        if args.cache_dir:
            return PersistentCache(args.cache_dir, readonly=readonly)
        if options.CACHE_DIR.value is None:
            raise CommandError(
                "the persistent cache is off (KERNELTUNE_CACHE_DIR=off); pass --cache-dir DIR."
            )
        return PersistentCache(None)
    except ValueError as e:
        raise CommandError(str(e)) from None


def _entries(cache: PersistentCache[Any], op: str | None) -> list[CacheEntry]:
    found = [
        e for e in cache.entries(readonly_layers=True) if op is None or op_matches(e.op_id, op)
    ]
    found.sort(key=lambda e: (e.op_id, e.signature or "", e.dev, e.call_key))
    return found


def _config_types() -> dict[str, type]:
    """Config types by op id, of the kernels defined in this process (the bundled ones
    always), so that `prune` can tell invalid entries."""
    import kerneltune.kernels  # noqa: F401  (the bundled kernels register on import)

    types: dict[str, type] = {}
    for cls in registered_kernels().values():
        if cls.config_type is not None:
            for op_id in served_op_ids(cls):
                types[f"{op_id}@v{cls.version}"] = cls.config_type
    return types


# --- formatting -----------------------------------------------------------------------


format_time = format_seconds


def format_age(created: float, now: float) -> str:
    age = max(0.0, now - created)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if age >= size:
            return f"{age / size:.0f}{unit}"
    return f"{age:.0f}s"


def format_cfg(cfg: Any) -> str:
    if isinstance(cfg, dict):
        return " ".join(f"{k}={_compact(v)}" for k, v in cfg.items())
    return str(cfg)


def cfg_text(cfg: Any) -> str:
    """A config (a dataclass or a dict of fields) as `format_cfg` prints it."""
    from kerneltune._src.core.keys import config_to_dict

    try:
        return format_cfg(config_to_dict(cfg))
    except TypeError:
        return str(cfg)


def _compact(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _shorten(text: str, width: int | None) -> str:
    if width is None or len(text) <= width:
        return text
    return text[: width - 1] + "…"


def print_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    rows = [list(header), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


# --- commands ---------------------------------------------------------------------------


def info(args: argparse.Namespace) -> int:
    try:
        return _info(args)
    except ValueError as e:  # a KERNELTUNE_* variable with a value it does not allow
        raise CommandError(str(e)) from None


def _info(args: argparse.Namespace) -> int:
    import jax

    from kerneltune._src.core import devices

    device = jax.devices()[0]
    print(f"device        {device.device_kind} ({device.platform}), {jax.device_count()} visible")
    print(f"fingerprint   {devices.device_fingerprint()}")
    print(f"backend       {devices.get_device_platform()}")
    if args.cache_dir is None and options.CACHE_DIR.value is None:
        print("cache         off (KERNELTUNE_CACHE_DIR=off)")
    else:
        cache = _open(args)
        mode = " (some entries could not be written: kept in memory)" if cache.memory_only else ""
        print(f"cache         {cache.location}{mode}")
        for layer in cache.readonly_locations:
            print(f"  read-only   {layer}")
        print(f"entries       {len(cache)}")
    if not args.cache_dir and not options.CACHE_DIR.value:
        print(f"default dir   {default_cache_dir()}")
    versions = runtime_versions()
    print(
        f"versions      kerneltune {versions['kerneltune']}, jax {versions['jax']}, "
        f"jaxlib {versions['jaxlib']}, python {platform.python_version()}"
    )
    for name, value in options.describe().items():
        print(f"  {name:<27} {value if value not in ('', ()) else '(unset)'}")
    return 0


def ls(args: argparse.Namespace) -> int:
    cache = _open(args)
    found = _entries(cache, args.op)
    if not found:
        which = f" for op {args.op!r}" if args.op else ""
        print(f"no entries{which} in {cache.location}")
        return 0
    width = None if args.wide else 40
    many_devices = len({e.dev for e in found}) > 1
    now = time.time()
    header = ["op", "shapes", "config", "time", "speedup", "age", "provenance", "key"]
    if many_devices:
        header.insert(1, "device")
    rows = []
    for e in found:
        speedup = e.speedup
        row = [
            e.op_id,
            _shorten(e.signature or "?", width),
            _shorten(format_cfg(e.cfg), width),
            format_time(e.best_time_s),
            "-" if speedup is None else f"{speedup:.2f}x",
            format_age(e.created, now),
            f"{e.provenance}, budgeted" if e.budgeted else e.provenance,
            e.call_key[:12],
        ]
        if many_devices:
            row.insert(1, e.dev)
        rows.append(row)
    print_table(header, rows)
    print(f"{len(found)} entries")
    return 0


def show(args: argparse.Namespace) -> int:
    cache = _open(args)
    found = [e for e in _entries(cache, args.op) if e.call_key.startswith(args.key)]
    if not found:
        raise CommandError(f"no entry has a call key starting with {args.key!r}.")
    if len(found) > 1 and args.json:
        raise CommandError(
            f"{len(found)} entries match {args.key!r}; give more of the key: "
            + ", ".join(f"{e.op_id} {e.call_key[:16]}" for e in found[:10])
        )
    for i, entry in enumerate(found):
        if args.json:
            print(json.dumps(entry.to_document(), indent=2, sort_keys=True))
        else:
            if i:
                print()
            _print_entry(entry)
    return 0


def _print_entry(e: CacheEntry) -> None:
    created = datetime.datetime.fromtimestamp(e.created).isoformat(sep=" ", timespec="seconds")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(e.versions.items()))
    speedup = f" ({e.speedup:.2f}x over the heuristic)" if e.speedup else ""
    lines = [
        ("op", e.op_id),
        ("device", e.dev),
        ("call key", e.call_key),
        ("shapes", e.signature or "?"),
        ("config", format_cfg(e.cfg)),
        ("config type", e.cfg_type or "?"),
        (
            "provenance",
            f"{e.provenance}, tuned under a first-call budget (a full tuning completes it)"
            if e.budgeted
            else e.provenance,
        ),
        ("created", f"{created} ({format_age(e.created, time.time())} ago)"),
        ("versions", versions or "?"),
        ("timer", f"{e.timer or '?'}, strategy {e.strategy or '?'}, took {format_time(e.wall_s)}"),
        ("heuristic", f"{format_cfg(e.heuristic_cfg)}: {format_time(e.heuristic_time_s)}"),
        ("best", f"{format_time(e.best_time_s)}{speedup}"),
        ("stored at", e.path),
    ]
    for name, value in lines:
        print(f"{name:<12} {value}")
    if e.candidates:
        print(f"candidates ({len(e.candidates)}):")
        rows = []
        for c in sorted(
            e.candidates, key=lambda c: (c.get("time_s") is None, c.get("time_s") or 0)
        ):
            samples = c.get("samples_s") or []
            rows.append(
                [
                    "  " + str(c.get("status", "?")),
                    format_time(c.get("time_s")),
                    str(len(samples)),
                    format_cfg(c.get("cfg")),
                    _shorten(str(c.get("error") or ""), 60),
                ]
            )
        print_table(["  status", "time", "samples", "config", "error"], rows)


def _transfer(action: Callable[[], int], failure: str, done: str, where: str) -> int:
    """Runs `action`, which moves entries and returns how many, and prints
    "<done> <n> entries <where>"; a file or format error becomes a one-line
    CommandError that starts with `failure`."""
    try:
        n = action()
    except (OSError, ValueError) as e:
        raise CommandError(f"{failure}: {e}") from None
    print(f"{done} {n} entries {where}")
    return 0


def export(args: argparse.Namespace) -> int:
    cache = _open(args)
    write = functools.partial(cache.export, args.file, readonly_layers=args.with_readonly)
    return _transfer(write, f"cannot write {args.file}", "exported", f"to {args.file}")


def import_(args: argparse.Namespace) -> int:
    cache = _open(args)
    read = functools.partial(cache.import_, args.file, provenance=args.provenance)
    # The error names the file (an OSError's and the cache's own errors do).
    return _transfer(read, "cannot import", "imported", f"into {cache.location}")


def merge(args: argparse.Namespace) -> int:
    cache = _open(args)
    merged = functools.partial(cache.merge, *args.sources)
    return _transfer(merged, "cannot merge", "merged", f"into {cache.location}")


def clear(args: argparse.Namespace) -> int:
    cache = _open(args)
    if not args.yes and sys.stdin.isatty():
        what = f"the entries of {args.op!r}" if args.op else f"all {len(cache)} entries"
        answer = input(f"Remove {what} from {cache.location}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    n = cache.clear(args.op)
    print(f"removed {n} entries from {cache.location}")
    return 0


def prune(args: argparse.Namespace) -> int:
    cache = _open(args)
    n = cache.prune(
        older_than_days=args.older_than,
        other_versions=args.other_versions,
        invalid=True,
        cfg_types=_config_types(),
    )
    print(f"removed {n} entries from {cache.location}")
    return 0
