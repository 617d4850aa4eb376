"""A mkdocs hook: the command-line page from kerneltune's own argument parser."""

from __future__ import annotations

import argparse
import os

MARKER = "<!-- cli-reference -->"


def _commands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, str]]:
    """`(command line, help text)` for the parser and every subcommand, depth first."""
    out = [(prefix, parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, f"{prefix} {name}")
    return out


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    os.environ["COLUMNS"] = "100"  # the same wrapping wherever the site is built
    from kerneltune.cli import build_parser

    sections = []
    for command, text in _commands(build_parser(), "kerneltune"):
        sections.append(f"## `{command}`\n\n```text\n{text.rstrip()}\n```\n")
    return markdown.replace(MARKER, "\n".join(sections))
