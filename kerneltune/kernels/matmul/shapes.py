"""Matmul problem shapes `(m, k, n)` shared by the tests, the demo and the GPU benchmark."""

#: Small shapes for CPU tests (Pallas interpreter): aligned, uneven, skinny.
TEST_SHAPES = ((64, 128, 96), (100, 70, 50), (16, 256, 64))
#: The demo on a CPU (the Pallas interpreter: tiny) and on a GPU.
DEMO_SHAPES_CPU = ((128, 128, 128), (64, 256, 128))
DEMO_SHAPES_GPU = ((2048, 2048, 2048), (4096, 4096, 4096))
#: The GPU benchmark: square from 1024³ to 8192³, and skinny ones.
BENCH_SHAPES = (
    (4096, 4096, 4096),
    (1024, 1024, 1024),
    (8192, 8192, 8192),
    (64, 8192, 8192),
    (8192, 1024, 8192),
)
