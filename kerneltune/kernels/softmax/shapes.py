"""Softmax shapes `(rows, n)` shared by the tests, the demo and the GPU benchmark."""

TEST_SHAPES = ((4, 8, 128), (7, 100), (2, 2048))
DEMO_SHAPES_CPU = ((64, 256), (16, 1000))
DEMO_SHAPES_GPU = ((8192, 4096), (32768, 1024))
BENCH_SHAPES = ((8192, 1024), (16384, 4096), (4096, 16384), (65536, 512))
