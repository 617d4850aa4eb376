"""The `kerneltune` command line: the command tables, the parser and `main`.

Every command is one entry of `COMMANDS` (or of a group's table, like `cache`): its help
line, a function that declares its arguments, and the function that runs it, named as
"module:function" and imported only when that command runs, so that `kerneltune --help`
and a mistyped command stay fast.

Exit status: 0 on success, 1 when the command failed (the message says why), 2 for bad
usage (argparse's usage message, no traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Defined below the command modules, which raise it, so that they never import this one.
from kerneltune._src.cli.errors import CommandError as CommandError


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand.

    Attributes:
      help: the one-line help shown in `kerneltune --help`.
      run: "module:function"; the function takes the parsed `argparse.Namespace` and
        returns the exit status.
      add_arguments: declares the command's arguments on its parser: a function, or
        "module:function" when that module is cheap to import (the parser imports it
        even when another command runs).
    """

    help: str
    run: str
    add_arguments: Callable[[argparse.ArgumentParser], None] | str = lambda parser: None


@dataclasses.dataclass(frozen=True)
class Group:
    """A command with subcommands of its own (`kerneltune cache ls`)."""

    help: str
    commands: Mapping[str, Command]


# --- arguments of the commands ----------------------------------------------------------


def _op_filter(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", help='only this op: "matmul" (any version) or "matmul@v1"')


def _ls_arguments(parser: argparse.ArgumentParser) -> None:
    _op_filter(parser)
    parser.add_argument("--wide", action="store_true", help="do not shorten long columns")


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", help="a call key, or enough of its first characters")
    _op_filter(parser)
    parser.add_argument("--json", action="store_true", help="print the stored JSON document")


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the JSON file (or URL) to write")
    parser.add_argument(
        "--with-readonly", action="store_true", help="include the read-only layers' entries"
    )


def _import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a file written by `kerneltune cache export`")
    parser.add_argument(
        "--provenance",
        choices=("imported", "shipped"),
        default="imported",
        help="how the entries are marked (default: imported)",
    )


def _merge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources", nargs="+", metavar="SRC", help="cache directories, URLs or export files"
    )
    parser.set_defaults(trailing_words_join="sources")  # SRCs may also follow options (see main)


def _clear_arguments(parser: argparse.ArgumentParser) -> None:
    _op_filter(parser)
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ops",
        metavar="NAME,...",
        help="only these rows, e.g. ragged_dot,moe (an unknown name lists them all)",
    )
    parser.add_argument(
        "--no-tokamax", action="store_true", help="leave tokamax out even where it imports"
    )


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of days >= 0, got {text!r}")
    return value


def _prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--older-than", type=_days, metavar="DAYS", help="remove entries older than DAYS"
    )
    parser.add_argument(
        "--other-versions",
        action="store_true",
        help="remove entries written by other kerneltune/jax/jaxlib versions",
    )
    parser.description = (
        "Remove stale entries. Entries that cannot be read, or whose config does not fit "
        "its kernel's config type (for the kernels kerneltune ships), are always removed."
    )


# --- the command tables -----------------------------------------------------------------

_CACHE = "kerneltune._src.cli.cache_commands"

CACHE_COMMANDS: dict[str, Command] = {
    "ls": Command("list the entries as a table", f"{_CACHE}:ls", _ls_arguments),
    "show": Command("show one entry with every candidate", f"{_CACHE}:show", _show_arguments),
    "export": Command("write every entry to one JSON file", f"{_CACHE}:export", _export_arguments),
    "import": Command("add the entries of an export file", f"{_CACHE}:import_", _import_arguments),
    "merge": Command("add other caches' entries (newer wins)", f"{_CACHE}:merge", _merge_arguments),
    "clear": Command("remove entries (all, or one op's)", f"{_CACHE}:clear", _clear_arguments),
    "prune": Command("remove old or out-of-date entries", f"{_CACHE}:prune", _prune_arguments),
}

# Top-level commands. To add one (demo, report): write `run(args) -> int` in your own
# module, declare its arguments in a small function above (or in your module, if
# importing it is cheap: name it as "module:function"), and add one entry here.
COMMANDS: dict[str, Command | Group] = {
    "info": Command("show the device, its fingerprint, the cache and versions", f"{_CACHE}:info"),
    "cache": Group("inspect, share and clean the persistent cache", CACHE_COMMANDS),
    "tune": Command(
        "tune the calls recorded in a manifest (or one shard of it)",
        "kerneltune._src.cli.tune_command:run",
        "kerneltune._src.cli.tune_command:add_arguments",
    ),
    "explain": Command(
        "which config a call gets, from which tier, and why",
        "kerneltune._src.cli.explain_command:run",
        "kerneltune._src.cli.explain_command:add_arguments",
    ),
    "demo": Command(
        "each bundled op against plain JAX and tokamax: time, first call, memory",
        "kerneltune._src.cli.demo:run",
        _demo_arguments,
    ),
    "report": Command(
        "the last demo's comparison and every tuned key's candidates, as tables and plots",
        "kerneltune._src.cli.report_command:run",
        "kerneltune._src.cli.report_command:add_arguments",
    ),
}


# --- the parser -------------------------------------------------------------------------


def _cache_dir_option(parser: argparse.ArgumentParser, *, default: object) -> None:
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=default,
        help="the cache directory or URL (default: KERNELTUNE_CACHE_DIR, else the user "
        "cache directory)",
    )


def _add_commands(
    parser: argparse.ArgumentParser, table: Mapping[str, Command | Group], title: str
) -> None:
    subparsers = parser.add_subparsers(title=title, metavar="COMMAND")
    for name, command in table.items():
        sub = subparsers.add_parser(name, help=command.help, description=command.help)
        # Also accepted after the command; SUPPRESS keeps a value given before it.
        _cache_dir_option(sub, default=argparse.SUPPRESS)
        if isinstance(command, Group):
            _add_commands(sub, command.commands, f"{name} commands")
            sub.set_defaults(_usage=sub)
        else:
            add_arguments = command.add_arguments
            if isinstance(add_arguments, str):
                add_arguments = _resolve(add_arguments)
            add_arguments(sub)
            sub.set_defaults(_run=command.run, _usage=sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerneltune",
        description="Pick, inspect and share the best configs for JAX kernels.",
    )
    from kerneltune._src.version import __version__

    parser.add_argument("--version", action="version", version=f"kerneltune {__version__}")
    _cache_dir_option(parser, default=None)
    _add_commands(parser, COMMANDS, "commands")
    parser.set_defaults(_usage=parser)
    return parser


def _resolve(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `kerneltune` command with `argv` (default: `sys.argv[1:]`); returns the
    exit status."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        rest = getattr(args, "trailing_words_join", None)
        if extra and rest is not None and not any(a.startswith("-") for a in extra):
            # argparse fills a list of positionals only from the words before the first
            # option (`explain matmul --cache-dir D f32[8,8]`); the later ones join it.
            getattr(args, rest).extend(extra)
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # argparse exits on bad usage (2), --help and --version (0)
        return e.code if isinstance(e.code, int) else 2
    run = getattr(args, "_run", None)
    if run is None:
        usage: argparse.ArgumentParser = args._usage
        usage.print_usage(sys.stderr)
        print(f"{usage.prog}: error: a command is required", file=sys.stderr)
        return 2
    try:
        return int(_resolve(run)(args) or 0)
    except CommandError as e:
        print(f"kerneltune: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
