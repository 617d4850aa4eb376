"""Matmul against `jnp.dot` (cuBLAS), and a wide sweep of JAX's Mosaic GPU matmul.

    python -m benchmarks.matmul_gpu [--json OUT.json] [--smoke]
    python -m benchmarks.matmul_gpu --sweep-s 60     # the Mosaic sweep at 4096³ (Hopper)

The table's columns are `benchmarks/README.md`'s; shapes are
`kerneltune/kernels/matmul/shapes.py`'s `BENCH_SHAPES`. The sweep times many more
Mosaic configs than the tuner's curated space (more tiles, every cluster choice,
several grid orders, two pipeline depths each), to see whether that space misses a
faster one; it prints the fastest against `jnp.dot` in one tuning session.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp

import kerneltune as kt
from benchmarks import harness as h
from benchmarks import op_bench
from benchmarks.results import Row
from kerneltune._src.cli.report_command import format_cfg
from kerneltune._src.core.configs import config_to_dict
from kerneltune.kernels import Matmul
from kerneltune.kernels.matmul import mosaic_space, shapes
from kerneltune.kernels.matmul.config import MatmulConfig, MatmulProblem

CUBLAS = "jnp.dot"


def rows(shape: tuple[int, int, int], st: op_bench.Settings) -> list[Row]:
    m, k, n = shape
    sets = h.arg_sets(lambda seed: (h.normal(2 * seed, (m, k)), h.normal(2 * seed + 1, (k, n))))
    impls, tuning = op_bench.impls("matmul", st)
    return [op_bench.measure(Row("matmul", "fwd", f"{m}x{k}x{n}"), impls, sets, tuning)]


FAMILY = {"matmul": op_bench.Family(rows, shapes.BENCH_SHAPES, shapes.SMOKE_SHAPES)}


def wide_mosaic_space(p: MatmulProblem) -> list[MatmulConfig]:
    """The sweep's configs, pruned by the tuner's own rules."""
    out = []
    tiles = (*mosaic_space.TILES, (128, 128, "n"), (256, 64, "m"))
    for (block_m, block_n, wg), cluster, (minor, width) in itertools.product(
        tiles, (None, "m", "n"), (("n", 1), ("n", 8), ("m", 8), ("n", 16))
    ):
        base = MatmulConfig(
            backend="mosaic", block_m=block_m, block_n=block_n, block_k=mosaic_space.BK, wg_dimension=wg,
            cluster_dimension=cluster, grid_minor_dim=minor, grid_tile_width=width,
            max_concurrent_steps=1,
        )  # fmt: skip
        deepest = mosaic_space.deepest_steps(p, base, 227 * 1024)
        for steps in (deepest, deepest - 1):
            out.append(dataclasses.replace(base, max_concurrent_steps=max(steps, 1)))
    return mosaic_space.candidates(p, configs=out)[0]


def sweep_mosaic(seconds: float, size: int = 4096) -> None:
    """Times the wide Mosaic space at `size`³ bf16 (shuffled, for `seconds`) with
    `jnp.dot` in the same session, and prints the ten fastest."""
    p = MatmulProblem(size, size, size, jnp.dtype(jnp.bfloat16))
    cands: list[Any] = wide_mosaic_space(p)
    curated = set(mosaic_space.candidates(p)[0])
    random.Random(0).shuffle(cands)
    x, y = h.normal(1, (size, size)), h.normal(2, (size, size))
    kernel = Matmul()

    def make(cfg: Any) -> Callable[..., Any]:
        if cfg == CUBLAS:
            return lambda a, b: jnp.dot(a, b)
        return functools.partial(kernel.run, cfg=cfg)

    tuner = kt.Tuner(progress=False, strategy="exhaustive", time_budget_s=seconds)
    rep = tuner.tune(make, (x, y), {}, [CUBLAS, *cands], reference_cfg=CUBLAS)
    done = sorted((c for c in rep.candidates if c.ok and c.cfg != CUBLAS), key=lambda c: c.time_s)
    cublas = next((c.time_s for c in rep.candidates if c.cfg == CUBLAS and c.ok), None)
    tflops = 2 * size**3 / 1e12
    print(
        f"Mosaic sweep {size}³ bf16: {len(done)} timed, {rep.num_failed} failed of {len(cands)} "
        f"in {rep.wall_s:.0f} s; jnp.dot {tflops / cublas if cublas else float('nan'):.0f} TFLOP/s"
    )
    for c in done[:10]:
        pct = f"{100 * cublas / c.time_s:.0f}%" if cublas else "-"
        mark = "*" if c.cfg in curated else " "
        print(
            f" {mark} {tflops / c.time_s:6.0f} TFLOP/s {pct:>5}  {format_cfg(config_to_dict(c.cfg))}"
        )
    print("   (* = in the tuner's curated space)")


def main(argv: Sequence[str] | None = None) -> list[Row]:
    def sweep_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--sweep-s",
            type=float,
            default=None,
            metavar="S",
            help="instead of the table, time the wide Mosaic space at 4096³ for S seconds "
            "against jnp.dot (Hopper)",
        )

    args = op_bench.parse(FAMILY, argv, __doc__ or "", extra=sweep_option)
    if args.sweep_s is not None:
        sweep_mosaic(args.sweep_s)
        return []
    return op_bench.run(FAMILY, argv, "benchmarks.matmul_gpu", __doc__ or "", args=args)


if __name__ == "__main__":
    main()
