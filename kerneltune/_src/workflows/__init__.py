"""Whole programs and processes: offline and whole-function tuning, worker processes
and isolation, agreement checks, batching rules, `explain` and `benchmark`. It imports
every layer below, up to `execution`."""
