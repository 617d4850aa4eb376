"""The README, docs/, examples/ and benchmarks/ run as written."""
