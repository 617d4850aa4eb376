"""Gated-linear-unit shapes `(tokens, features, hidden)` shared by the tests and the GPU
benchmark."""

#: Small shapes for CPU tests (Pallas interpreter): aligned and uneven.
TEST_SHAPES = ((32, 32, 48), (20, 24, 40))
#: The GPU benchmark: Llama-class MLP widths (3B: 2048 → 5632 as in issue 29; 8B:
#: 4096 → 14336; 1B: 2048 → 8192).
BENCH_SHAPES = (
    (16384, 2048, 5632),
    (8192, 4096, 14336),
    (16384, 2048, 8192),
    (32768, 2048, 5632),
)
#: Every code path of the benchmark once, on any device.
SMOKE_SHAPES = ((64, 32, 64),)
