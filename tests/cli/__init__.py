"""Tests of `kerneltune/_src/cli`: the `kerneltune` command and its subcommands."""
