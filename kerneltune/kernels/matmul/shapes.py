"""Matmul problem shapes `(m, k, n)` shared by the tests and the GPU benchmark."""

#: Small shapes for CPU tests (Pallas interpreter): aligned, uneven, skinny.
TEST_SHAPES = ((64, 128, 96), (100, 70, 50), (16, 256, 64))
#: The GPU benchmark (benchmarks/matmul_gpu.py): square, skinny and wide.
BENCH_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (64, 8192, 8192), (16384, 1024, 16384))
#: Every code path of the benchmark once, on any device.
SMOKE_SHAPES = ((8, 128, 64),)
