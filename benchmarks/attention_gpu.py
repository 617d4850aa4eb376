"""Attention, forward and training step (fwd+bwd), against cuDNN, XLA and tokamax.

    python -m benchmarks.attention_gpu [--json OUT.json] [--smoke]

Columns as in `benchmarks/README.md`: plain XLA, cuDNN, tokamax (when it imports),
kerneltune with its heuristic config and tuned from an empty cache (plus the shipped
tables), the backend the tuned configs name, and best other ÷ tuned. Shapes are
`kerneltune/kernels/attention/shapes.py`'s `BENCH_SHAPES`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from benchmarks import harness as h
from benchmarks import op_bench
from benchmarks.results import Row
from kerneltune.kernels.attention import shapes


def rows(shape: tuple[int, int, int, int, bool], st: op_bench.Settings) -> list[Row]:
    """The forward and the training step of attention over `(B, T, N, H)` inputs."""
    b, t, n, d, causal = shape
    sets = h.arg_sets(lambda seed: tuple(h.normal(3 * seed + i, (b, t, n, d)) for i in range(3)))
    text = f"B{b} T{t} N{n} H{d}" + (" causal" if causal else "")
    out = []
    for pass_, wrap in (("fwd", lambda f: f), ("fwd+bwd", op_bench.fwd_bwd)):
        impls, tuning = op_bench.impls("attention", st)
        fns = {k: f and wrap(functools.partial(f, causal=causal)) for k, f in impls.items()}
        out.append(op_bench.measure(Row("attention", pass_, text), fns, sets, tuning))
    return out


FAMILY = {"attention": op_bench.Family(rows, shapes.BENCH_SHAPES, shapes.SMOKE_SHAPES)}


def main(argv: Sequence[str] | None = None) -> list[Row]:
    return op_bench.run(FAMILY, argv, "benchmarks.attention_gpu", __doc__ or "")


if __name__ == "__main__":
    main()
