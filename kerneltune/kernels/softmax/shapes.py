"""Softmax shapes `(rows, n)` shared by the tests, the demo and the GPU benchmark."""

TEST_SHAPES = ((4, 8, 128), (7, 100), (2, 2048))
DEMO_SHAPES_CPU = ((64, 256), (16, 1000))
DEMO_SHAPES_GPU = ((8192, 4096), (32768, 1024))
#: The GPU benchmark (benchmarks/rowwise_gpu.py): widths 1k–32k.
BENCH_SHAPES = ((16384, 1024), (16384, 2048), (8192, 8192), (4096, 32768))
#: Every code path of the benchmark once, on any device.
SMOKE_SHAPES = ((64, 128),)
