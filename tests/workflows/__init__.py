"""Tests of `kerneltune/_src/workflows`: offline and whole-function tuning, batches,
explain, worker processes."""
