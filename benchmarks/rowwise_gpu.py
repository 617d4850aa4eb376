"""layer_norm, rms_norm and softmax (forward) against XLA's fusions and tokamax, with
the % of the device's copy bandwidth kerneltune reaches.

    python -m benchmarks.rowwise_gpu [--json OUT.json] [--ops rms_norm] [--smoke]

Each op normalises over the last axis of a bf16 `[rows, width]` array; the bytes moved
are one read and one write of it, over the time, as a % of an elementwise pass's
bandwidth measured in the same run. Shapes are the kernels' `shapes.py` `BENCH_SHAPES`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from benchmarks import harness as h
from benchmarks import op_bench
from benchmarks.results import Row
from kerneltune.kernels.normalization import shapes as norm_shapes
from kerneltune.kernels.softmax import shapes as softmax_shapes

#: How many `[width]` parameter vectors each op takes after `x`.
PARAMS = {"layer_norm": 2, "rms_norm": 1, "softmax": 0}


def rows(op: str, shape: tuple[int, int], st: op_bench.Settings) -> list[Row]:
    """One op over `[rows, width]`, with the % of copy bandwidth that kerneltune
    reaches (tuned, else heuristic)."""
    n_rows, width = shape

    def make(seed: int) -> tuple[jax.Array, ...]:
        extra = tuple(h.normal(100 + seed + i, (width,)) for i in range(PARAMS[op]))
        return (h.normal(seed, shape), *extra)

    impls, tuning = op_bench.impls(op, st)
    row = op_bench.measure(Row(op, "fwd", f"{n_rows}x{width}"), impls, h.arg_sets(make), tuning)
    row.bytes_moved = 2 * n_rows * width * 2  # bf16 read once, written once
    kt_time = row.times.get("kt_tuned") or row.times.get("kt_heuristic")
    if kt_time and st.bandwidth:
        row.pct_copy = 100 * row.bytes_moved / kt_time / st.bandwidth
    return [row]


def _family(op: str, shapes: object) -> op_bench.Family:
    def op_rows(shape: tuple[int, int], st: op_bench.Settings) -> list[Row]:
        return rows(op, shape, st)

    return op_bench.Family(
        op_rows,
        shapes.BENCH_SHAPES,
        shapes.SMOKE_SHAPES,
        rowwise=True,  # type: ignore[attr-defined]
    )


FAMILY = {
    "layer_norm": _family("layer_norm", norm_shapes),
    "rms_norm": _family("rms_norm", norm_shapes),
    "softmax": _family("softmax", softmax_shapes),
}


def main(argv: Sequence[str] | None = None) -> list[Row]:
    return op_bench.run(FAMILY, argv, "benchmarks.rowwise_gpu", __doc__ or "")


if __name__ == "__main__":
    main()
