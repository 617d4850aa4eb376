"""Where a tuning's build time goes for Pallas grouped-matmul candidates: lowering (JAX's
tracing, Python, one at a time) against compiling (XLA and Mosaic in C++), and what
lowering in worker processes would leave to the tuning process.

For one product's configs (by default `drhs` at the `moe_off16` MoE shape, JAX's Mosaic
GPU kernels through kerneltune's wrappers, the key that costs `kt.autotune` most, issue
45), four ways to build them, each on configs not built before in this process:

- serial: lower then compile each config, one after another (what one tuning lane
  costs; the baseline of the ratios);
- threads: lower one after another, compile on one thread each (what the tuner does);
- workers: `--workers` processes each lower a share of the configs and export them
  (`jax.export`); this process loads each export (a lowering with no tracing of the
  kernel) and compiles them on threads. The wall includes starting the workers.
  Exports are serialized with `flatbuffers`, which JAX does not require: without it
  this row says so.

The workers' programs are checked against the same configs lowered here (their
outputs must be equal). `--smoke` runs kerneltune's interpreted Triton kernel at a tiny
shape on any machine (the CPU test).

    python -m benchmarks.candidate_builds_gpu
    python -m benchmarks.candidate_builds_gpu --configs 12 --workers 4 --json out.json

Run from the repository root on a Hopper GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness as h
from kerneltune.kernels.ragged_dot import shapes as ragged_shapes
from kerneltune.kernels.ragged_dot.config import RaggedDotConfig

#: `moe_off16`'s d_rhs: 6144 tokens top-2, D 3072, F 8192, 16 experts (benchmarks/first_use_gpu).
SHAPE = (12288, 3072, 8192, 16)
SMOKE_SHAPE = (64, 32, 32, 2)


def configs(smoke: bool) -> list[RaggedDotConfig]:
    """The configs, in build order: Mosaic tiles with block_k 64 (JAX 0.11's Mosaic
    kernels do not lower block_k 32), or small Triton tiles for the interpreter."""
    if smoke:
        return [
            RaggedDotConfig(block_m=bm, block_n=bn, block_k=16, num_warps=4, num_stages=2)
            for bm, bn in itertools.product((16, 32), (16, 32))
        ] * 4  # enough for every way's share; each build is a fresh trace anyway
    return [
        RaggedDotConfig(
            backend="mosaic", block_m=bm, block_n=bn, block_k=64,
            max_concurrent_steps=steps, grid_block_n=width,
        )
        for width, bm, bn, steps in itertools.product((1, 2), (64, 128), (64, 128, 256), (2, 4))
    ]  # fmt: skip


def product(cfg: RaggedDotConfig, smoke: bool) -> Callable[..., Any]:
    """d_rhs `[G, K, N]` of (x `[M, K]`, d_out `[M, N]`, group sizes) for `cfg`."""
    if smoke:
        from kerneltune.kernels.ragged_dot.pallas_triton import grouped_transposed_matmul

        return lambda x, dout, sizes: grouped_transposed_matmul(
            x, dout, sizes, cfg, out_dtype=jnp.float32, interpret=True
        )
    from kerneltune.kernels.ragged_dot.pallas_mosaic import transposed_ragged_dot_mosaic

    return lambda x, dout, sizes: transposed_ragged_dot_mosaic(x, dout, sizes, cfg)


def specs(smoke: bool) -> tuple[jax.ShapeDtypeStruct, ...]:
    """The operands' shapes: x `[M, K]`, d_out `[M, N]`, group sizes `[G]`."""
    m, k, n, g = SMOKE_SHAPE if smoke else SHAPE
    dtype = jnp.float32 if smoke else jnp.bfloat16
    return (
        jax.ShapeDtypeStruct((m, k), dtype),
        jax.ShapeDtypeStruct((m, n), dtype),
        jax.ShapeDtypeStruct((g,), jnp.int32),
    )


def operands(smoke: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Random operands of `specs`' shapes, routed with skew and one empty group."""
    x, dout, sizes = specs(smoke)
    return (
        h.normal(0, x.shape, x.dtype),
        h.normal(1, dout.shape, dout.dtype),
        jnp.asarray(ragged_shapes.skewed(x.shape[0], sizes.shape[0], empty=1), jnp.int32),
    )


def _lower(cfg: RaggedDotConfig, args: Sequence[Any], smoke: bool) -> Any:
    return jax.jit(product(cfg, smoke)).lower(*args)


def _compile_on_threads(lowered: Sequence[Any]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(max(1, len(lowered))) as pool:
        return list(pool.map(lambda low: low.compile(), lowered))


def serial(cfgs: Sequence[RaggedDotConfig], args: Sequence[Any], smoke: bool) -> dict[str, float]:
    lower_s = compile_s = 0.0
    for cfg in cfgs:
        start = time.perf_counter()
        low = _lower(cfg, args, smoke)
        lower_s += time.perf_counter() - start
        start = time.perf_counter()
        low.compile()
        compile_s += time.perf_counter() - start
    return {"wall_s": lower_s + compile_s, "lower_s": lower_s, "compile_s": compile_s}


def threads(cfgs: Sequence[RaggedDotConfig], args: Sequence[Any], smoke: bool) -> dict[str, float]:
    start = time.perf_counter()
    lowered = [_lower(cfg, args, smoke) for cfg in cfgs]
    lower_s = time.perf_counter() - start
    _compile_on_threads(lowered)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "lower_s": lower_s, "compile_s": wall - lower_s}


def can_serialize() -> bool:
    """Whether `jax.export` can serialize here (it needs `flatbuffers`)."""
    return importlib.util.find_spec("flatbuffers") is not None


def workers(indices: Sequence[int], args: Sequence[Any], smoke: bool, count: int) -> dict[str, Any]:
    """Exports `configs(smoke)[i]` for `i` in `indices` in `count` worker processes,
    loads and compiles them here; checks the first one's output against the same
    config lowered here."""
    cfgs = configs(smoke)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        shares = [list(indices)[w::count] for w in range(count)]
        procs = [
            subprocess.Popen(
                _worker_command(out, share, smoke), env=env, stderr=subprocess.PIPE, text=True
            )
            for share in shares
            if share
        ]
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                tail = " | ".join(err.strip().splitlines()[-3:])
                raise RuntimeError(f"a worker exited with {proc.returncode}: {tail}")
        exported_s = time.perf_counter() - start
        load_start = time.perf_counter()
        lowered = []
        for i in indices:
            with open(os.path.join(out, f"{i}.export"), "rb") as f:
                loaded = jax.export.deserialize(bytearray(f.read()))
            lowered.append(jax.jit(loaded.call).lower(*args))
        load_s = time.perf_counter() - load_start
        compiled = _compile_on_threads(lowered)
        wall = time.perf_counter() - start
    got = np.asarray(compiled[0](*args), np.float32)
    want = np.asarray(jax.jit(product(cfgs[indices[0]], smoke))(*args), np.float32)
    return {
        "wall_s": wall,
        "workers_s": exported_s,
        "load_s": load_s,
        "compile_s": wall - exported_s - load_s,
        "same_output": bool(np.array_equal(got, want)),
    }


def _worker_command(out: str, indices: Sequence[int], smoke: bool) -> list[str]:
    flags = ["--worker", out, "--indices", ",".join(map(str, indices))]
    return [sys.executable, "-m", "benchmarks.candidate_builds_gpu", *flags, *(["--smoke"] * smoke)]


def worker(out: str, indices: Sequence[int], smoke: bool) -> None:
    """A worker process: exports the configs at `indices` to `out/<index>.export`
    (traced on the operands' shapes: no array is made here)."""
    cfgs, args = configs(smoke), specs(smoke)
    for i in indices:
        exported = jax.export.export(jax.jit(product(cfgs[i], smoke)))(*args)
        with open(os.path.join(out, f"{i}.export"), "wb") as f:
            f.write(exported.serialize())


def run(n: int, count: int, smoke: bool) -> dict[str, Any]:
    """Each way on its own `n` configs (fresh traces: JAX caches a lowering per config)."""
    every, args = configs(smoke), operands(smoke)
    if 3 * n > len(every):
        raise ValueError(
            f"--configs {n}: at most {len(every) // 3} here (3 ways, distinct configs)"
        )
    jax.block_until_ready(args)
    _lower(every[-1], args, smoke).compile()  # JAX's first compile, outside the rows
    rows: dict[str, Any] = {
        "serial": serial(every[:n], args, smoke),
        "threads": threads(every[n : 2 * n], args, smoke),
    }
    if not can_serialize():
        rows["workers"] = {"error": "n/a: jax.export needs flatbuffers to serialize"}
    else:
        try:
            rows["workers"] = workers(range(2 * n, 3 * n), args, smoke, count)
        except Exception as e:  # the other rows still print
            rows["workers"] = {"error": f"failed: {h.error_text(e)}"}
    return {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "shape": SMOKE_SHAPE if smoke else SHAPE,
        "configs": n,
        "workers": count,
        "rows": rows,
    }


def table(result: dict[str, Any]) -> str:
    base = result["rows"]["serial"]["wall_s"]
    lines = [
        f"({result['device']}, jax {result['jax']}) d_rhs {result['shape']}, "
        f"{result['configs']} configs a way, {result['workers']} workers",
        f"{'way':8} {'wall':>8} {'lower':>8} {'workers':>8} {'load':>8} {'compile':>8}  vs serial",
    ]
    for name, row in result["rows"].items():
        if "error" in row:
            lines.append(f"{name:8} {row['error']}")
            continue
        cells = [row.get(k) for k in ("wall_s", "lower_s", "workers_s", "load_s", "compile_s")]
        text = " ".join(f"{c:7.2f}s" if c is not None else f"{'-':>8}" for c in cells)
        check = "" if "same_output" not in row else f"  same output: {row['same_output']}"
        lines.append(f"{name:8} {text}  {base / row['wall_s']:.2f}x{check}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", type=int, default=8, help="configs built each way (default 8)")
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--smoke", action="store_true", help="interpreted Triton kernel, tiny shape")
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    p.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--indices", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker, [int(i) for i in a.indices.split(",") if i], a.smoke)
        return None
    if a.configs < 1 or a.workers < 1:
        p.error(f"--configs and --workers take 1 or more, got {a.configs} and {a.workers}")
    result = run(a.configs, a.workers, a.smoke)
    print(table(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
