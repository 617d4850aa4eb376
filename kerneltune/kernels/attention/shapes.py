"""Attention shapes `(batch, seq, heads, head_dim, causal)` shared by the tests and
the GPU benchmark."""

TEST_SHAPES = ((2, 64, 2, 32, False), (1, 128, 3, 16, True))
#: The GPU benchmark (benchmarks/attention_gpu.py): head dim 64 and 128, 1k–8k, causal
#: and not, batch × heads filling the GPU.
BENCH_SHAPES = (
    (8, 1024, 16, 128, False),
    (4, 2048, 32, 64, True),
    (2, 4096, 16, 128, True),
    (1, 8192, 32, 64, False),
)
#: Every code path of the benchmark once, on any device.
SMOKE_SHAPES = ((1, 64, 2, 32, True), (1, 128, 2, 64, False))
