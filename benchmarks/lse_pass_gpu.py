"""The loss head's pass over its written logits: each row's log-sum-exp and label logit.

    python -m benchmarks.lse_pass_gpu [--rounds N] [--tiles all|default]
    python -m benchmarks.lse_pass_gpu --smoke      # tiny shapes, any device, wall clock

The chunked loss head writes a chunk's `[rows, V]` logits in 16 bits (cuBLAS), then
reads them for each row's log-sum-exp and label logit before its gradient pass. Per
shape, in one process and interleaved rounds, on the same random bf16 logits:

- "xla 2-pass": what plain JAX runs (`jax.nn.logsumexp`, then `take_along_axis`);
- "xla 1-pass": kerneltune's XLA reduction (`lse_xla.lse_and_label_logit`);
- "triton bm×bv w s": the Pallas kernel (`lse_triton`) at those tiles, warps, stages;
- "read floor": one read of the logits at this run's measured copy bandwidth.

Each variant's results are checked against the XLA one-pass before it is timed.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness as h
from kerneltune.kernels.cross_entropy import lse_triton as lt
from kerneltune.kernels.cross_entropy import lse_xla

#: (rows, vocabulary): the small model's one chunk (8192 × 128k), a chunk of 2048
#: tokens, and the loss head benchmark's other vocabularies.
SHAPES = ((8192, 128256), (2048, 128256), (8192, 32000), (8192, 256000))
SMOKE_SHAPES = ((16, 2048),)


def two_pass(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    f = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(f, labels[:, None], axis=-1, mode="clip")[:, 0]
    return jax.nn.logsumexp(f, axis=-1), picked


def one_pass(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    return lse_xla.lse_and_label_logit(logits, labels)


def tile_grid(which: str) -> list[lt.LseTiles]:
    if which == "default":
        return [lt.DEFAULT_TILES]
    grid = itertools.product((1, 2, 4, 8), (512, 1024, 2048, 4096), (4, 8), (2,))
    return [lt.LseTiles(bm, bv, w, s) for bm, bv, w, s in grid]


def rows_for(shape: tuple[int, int], tiles: Sequence[lt.LseTiles], rounds: int, interpret: bool):
    m, v = shape
    labels = jax.random.randint(jax.random.key(7), (m,), 0, v)
    sets = h.arg_sets(lambda seed: (h.normal(seed, (m, v)) * 3.0, labels))
    fns: dict[str, Any] = {"xla 2-pass": two_pass, "xla 1-pass": one_pass}
    for t in tiles:
        if lt.fits(m, v, t):
            name = f"triton {t.block_m}x{t.block_v} w{t.num_warps} s{t.num_stages}"
            fns[name] = lambda x, lab, t=t: lt.lse_and_label_logit(x, lab, t, interpret=interpret)
    want = jax.jit(one_pass)(*sets[0])
    sessions, errors = {}, {}
    for name, fn in fns.items():
        try:
            got = jax.jit(fn)(*sets[0])
            err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(got, want))
            if not np.isfinite(err) or err > 1e-3:
                raise AssertionError(f"differs from the XLA one-pass by {err}")
            sessions[name] = h.session(fn, sets)
        except Exception as e:  # a tile that does not compile is a row, not a crash
            errors[name] = h.error_text(e)
    return h.interleaved_times(sessions, rounds=rounds), errors


def main(argv: Sequence[str] | None = None) -> dict[Any, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes (any device)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument(
        "--tiles",
        choices=("all", "default"),
        default="all",
        help="the Pallas kernel's 32 tile configs, or the shipped default alone",
    )
    p.add_argument("--shapes", type=int, default=None, help="only the first N shapes")
    args = p.parse_args(argv)
    shapes = (SMOKE_SHAPES if args.smoke else SHAPES)[: args.shapes]
    interpret = not h.on_gpu()
    tiles = tile_grid("default" if args.smoke else args.tiles)
    bandwidth = h.copy_bandwidth(1 << 30) if h.on_gpu() else None
    out: dict[Any, Any] = {}
    for shape in shapes:
        times, errors = rows_for(shape, tiles, args.rounds, interpret)
        out[shape] = times
        base = times["xla 1-pass"]
        read = shape[0] * shape[1] * 2
        floor = f", read floor {read / bandwidth * 1e3:.3f} ms" if bandwidth else ""
        print(f"\nlogits {shape[0]} x {shape[1]} bf16{floor}")
        print("variant | ms | x xla 1-pass | x xla 2-pass")
        for name, s in sorted(times.items(), key=lambda kv: kv[1]):
            print(f"{name} | {s * 1e3:.3f} | {base / s:.2f} | {times['xla 2-pass'] / s:.2f}")
        for name, e in errors.items():
            print(f"{name} | failed: {e}")
    return out


if __name__ == "__main__":
    main()
