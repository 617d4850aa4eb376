"""The Mosaic grouped matmul's strip width (`grid_block_n`) at MoE shapes, per product.

JAX's Mosaic GPU kernels (Hopper), through kerneltune's `pallas_mosaic` wrappers, for
the forward, d_lhs and d_rhs products, at 128x128 and 64x256 tiles with strips 1, 2 and
4 column tiles wide (block_k 64, 4 concurrent steps): each config's device time over
the fastest of them at that shape and product. Skewed routing with one empty expert.
The heuristic's strip rule (`ragged_dot/config.py: grid_block_n_rule`) was chosen on
this table (BENCHMARKS.md, 2026-11-28).

    python -m benchmarks.ragged_dot_strips_gpu
    python -m benchmarks.ragged_dot_strips_gpu --shapes 32768x2048x768x128 --json out.json

Run from the repository root on a Hopper GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import first_call_gpu
from benchmarks import harness as h
from kerneltune.kernels.ragged_dot import shapes as ragged_shapes
from kerneltune.kernels.ragged_dot.config import RaggedDotConfig
from kerneltune.kernels.ragged_dot.pallas_mosaic import (
    ragged_dot_mosaic,
    transposed_ragged_dot_mosaic,
)

#: (rows, k, n, experts): the held-out shapes of `first_call_gpu`, Mixtral's, and
#: `ragged_dot_gpu`'s fine-grained one.
SHAPES = (*first_call_gpu.RAGGED, (16384, 4096, 14336, 8), (32768, 2048, 1408, 64))
TILES = ((128, 128), (64, 256))
STRIPS = (1, 2, 4)
PRODUCTS = ("fwd", "dlhs", "drhs")


def product_call(product: str, cfg: RaggedDotConfig) -> Callable[..., Any]:
    """The product as a function of (its two operands, group sizes)."""
    if product == "drhs":
        return lambda x, dout, sizes: transposed_ragged_dot_mosaic(x, dout, sizes, cfg)
    transpose = product == "dlhs"
    return lambda a, b, sizes: ragged_dot_mosaic(a, b, sizes, cfg, transpose_rhs=transpose)


def operands(m: int, k: int, n: int, g: int) -> dict[str, tuple[Any, ...]]:
    """Each product's arguments: forward (x, w), d_lhs (d_out, w), d_rhs (x, d_out)."""
    x, w, dout = h.normal(0, (m, k)), h.normal(1, (g, k, n)), h.normal(2, (m, n))
    sizes = jnp.asarray(ragged_shapes.skewed(m, g, empty=1), jnp.int32)
    return {"fwd": (x, w, sizes), "dlhs": (dout, w, sizes), "drhs": (x, dout, sizes)}


def measure(shape: tuple[int, int, int, int]) -> list[dict[str, Any]]:
    rows = []
    for product, args in operands(*shape).items():
        times: dict[str, float] = {}
        errors: dict[str, str] = {}
        for (bm, bn), strips in itertools.product(TILES, STRIPS):
            name = f"{bm}x{bn}/{strips}"
            cfg = RaggedDotConfig(
                backend="mosaic", block_m=bm, block_n=bn, block_k=64,
                max_concurrent_steps=4, grid_block_n=strips,
            )  # fmt: skip
            try:
                times[name] = h.device_time(jax.jit(product_call(product, cfg)), [args])
            except Exception as e:  # one config that does not build keeps the others
                errors[name] = h.error_text(e)
        rows.append({"shape": list(shape), "product": product, "times": times, "errors": errors})
    return rows


def print_row(row: dict[str, Any]) -> None:
    m, k, n, g = row["shape"]
    times = row["times"]
    best = min(times.values(), default=None)
    cells = " ".join(
        f"{name}:{times[name] / best:.3f}" if name in times and best else f"{name}:failed"
        for name in (f"{bm}x{bn}/{s}" for (bm, bn), s in itertools.product(TILES, STRIPS))
    )
    fastest = f"{best * 1e6:8.1f} us" if best else "       -"
    print(f"{m}x{k}->{n} E{g:<4d} {row['product']:4s} fastest {fastest}  {cells}", flush=True)
    for name, text in row["errors"].items():
        print(f"    {name}: {text}")


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"--shapes: {text!r} is not ROWSxKxNxEXPERTS with positive integers, "
            "e.g. 32768x2048x768x128"
        )
    m, k, n, g = (int(p) for p in parts)
    return m, k, n, g


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shapes",
        type=parse_shape,
        nargs="+",
        default=list(SHAPES),
        help="ROWSxKxNxEXPERTS, e.g. 32768x2048x768x128 (default: 8 MoE shapes)",
    )
    p.add_argument("--json", default=None, help="write every time to this file")
    args = p.parse_args(argv)
    if not h.on_gpu():
        sys.exit("ragged_dot_strips_gpu: JAX's Mosaic grouped matmuls need a Hopper GPU.")
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}: time over the fastest")
    rows = []
    for shape in args.shapes:
        for row in measure(shape):
            print_row(row)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": jax.devices()[0].device_kind, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
