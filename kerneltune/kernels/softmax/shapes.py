"""Softmax shapes `(rows, n)` shared by the tests and the GPU benchmark."""

TEST_SHAPES = ((4, 8, 128), (7, 100), (2, 2048))
#: The GPU benchmark (benchmarks/rowwise_gpu.py): widths 1k–32k.
BENCH_SHAPES = ((16384, 1024), (16384, 2048), (8192, 8192), (4096, 32768))
#: Every code path of the benchmark once, on any device.
SMOKE_SHAPES = ((64, 128),)
