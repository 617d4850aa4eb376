"""Tests of `kerneltune/_src/execution`: the executor."""
