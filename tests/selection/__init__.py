"""Tests of `kerneltune/_src/selection`: the selection chain and its keys."""
