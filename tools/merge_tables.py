"""Merges the table files of a sharded `tools.ship_tables` run (`--shard I/N`, one
process a GPU, each with its own `--out`) into the table kerneltune ships for their
device kind (`kerneltune/kernels/tables/<device kind>.json`), from the repository root:

    PYTHONPATH=. python -m tools.merge_tables OUT/shard1.json OUT/shard2.json ...
    PYTHONPATH=. python -m tools.merge_tables OUT/shard*.json --out merged.json

An entry is one (op_id, call_key, dev): where several files hold it, the later file on
the command line wins, and the files win over the table already at `--out`, whose other
entries are kept (as `ship_tables` keeps them). Every file must describe one device
kind (the part of each entry's `dev` before "|"): tables of two GPU models are refused.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from kerneltune._src.caching import storage
from kerneltune._src.caching.shipped import device_kind_of
from tools.ship_tables import _identity, table_path


def device_kind(doc: dict[str, Any]) -> str:
    """The GPU model an entry was tuned on: its `dev` up to the "|" (as `ship_tables`
    names its table)."""
    return device_kind_of(str(doc["dev"]))


def read_tables(paths: Sequence[str]) -> list[list[dict[str, Any]]]:
    """Each file's entries, in order. Raises ValueError for a file that is not a table."""
    tables = []
    for path in paths:
        try:
            tables.append(storage.read_export_file(path))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return tables


def kind_of(paths: Sequence[str], tables: Sequence[list[dict[str, Any]]]) -> str:
    """The one device kind of every entry of `tables`. Raises ValueError, naming each
    file's kinds, when they are not one (a shard run on another GPU model, or `--out`
    naming another model's table): a merged table would answer one GPU with another's
    configs."""
    kinds = {p: sorted({device_kind(d) for d in t}) for p, t in zip(paths, tables, strict=True)}
    found = {k for ks in kinds.values() for k in ks}
    if len(found) > 1:
        listing = "; ".join(f"{p}: {', '.join(ks) or 'no entries'}" for p, ks in kinds.items())
        raise ValueError(f"the tables are of different device kinds ({listing})")
    if not found:
        raise ValueError(f"no entries in {', '.join(paths)}")
    return found.pop()


def merge(tables: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The entries of `tables`, one per (op_id, call_key, dev), a later table's entry
    replacing an earlier one's; sorted, so that the merged file is the same whichever
    order the shards finished in and its diffs show only changed entries."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for table in tables:
        for doc in table:
            merged[_identity(doc)] = doc
    return sorted(
        merged.values(), key=lambda d: (d["op_id"], d.get("signature", ""), *_identity(d)[1:])
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tables", nargs="+", help="table files written by `ship_tables --out`")
    p.add_argument(
        "--out", default=None, help="table file (default: the package's, for their device kind)"
    )
    args = p.parse_args(argv)
    try:
        tables = read_tables(args.tables)
        out = args.out or table_path(kind_of(args.tables, tables))
        # The table already at `out` comes first, so that the shards' entries win.
        held = read_tables([out]) if os.path.exists(out) else []
        kind_of([out] * len(held) + args.tables, held + tables)
    except (OSError, ValueError, KeyError, TypeError) as e:  # KeyError: an entry lacks a field
        print(f"merge_tables: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    docs = merge(held + tables)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    storage.write_export_file(out, docs, exported=time.time())
    print(f"{len(docs)} entries in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
