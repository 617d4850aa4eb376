"""Attention shapes `(batch, seq, heads, head_dim, causal)` shared by the tests, the
demo and the GPU benchmark."""

TEST_SHAPES = ((2, 64, 2, 32, False), (1, 128, 3, 16, True))
DEMO_SHAPES_CPU = ((1, 64, 2, 32, True), (1, 128, 2, 32, False))
DEMO_SHAPES_GPU = ((4, 2048, 16, 128, True), (8, 1024, 16, 64, False))
BENCH_SHAPES = (
    (4, 4096, 16, 128, True),
    (8, 2048, 32, 64, False),
    (16, 1024, 16, 128, True),
    (2, 8192, 16, 128, False),
)
