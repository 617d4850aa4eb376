"""Loss-head problem shapes `(tokens, features, vocab)` shared by the tests and the GPU
benchmark."""

#: Small shapes for CPU tests (Pallas interpreter): aligned, uneven, a vocabulary no
#: tile divides.
TEST_SHAPES = ((32, 32, 64), (24, 16, 100), (40, 48, 130))
#: The GPU benchmark (benchmarks/loss_head_gpu.py): Llama-class hidden sizes and
#: vocabularies of 32k, 128k and 256k.
BENCH_SHAPES = (
    (8192, 4096, 32000),
    (16384, 2048, 128256),
    (32768, 2048, 128256),
    (8192, 4096, 256000),
)
#: Every code path of the benchmark once, on any device.
SMOKE_SHAPES = ((64, 32, 256),)
