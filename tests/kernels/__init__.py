"""Tests of the bundled kernels (`kerneltune/kernels`): one file per op family, and the
suites every op runs (conformance, drop-in, second derivatives, GPU)."""
