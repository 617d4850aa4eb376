"""Benchmark scripts; run them from the repository root as modules (`python -m benchmarks.NAME`)."""
