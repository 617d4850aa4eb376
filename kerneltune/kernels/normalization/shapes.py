"""Normalization shapes `(rows, n)` shared by the tests and the GPU benchmark
(layer norm and RMS norm use the same ones)."""

TEST_SHAPES = ((4, 8, 256), (15, 200), (3, 1000))
#: The GPU benchmark (benchmarks/rowwise_gpu.py): widths 1k–16k.
BENCH_SHAPES = ((16384, 1024), (16384, 4096), (8192, 8192), (4096, 16384))
#: Every code path of the benchmark once, on any device.
SMOKE_SHAPES = ((64, 128), (32, 256))
