"""Tunes the bundled ops over a grid of common shapes on this GPU and writes the table
kerneltune ships for its device kind (`kerneltune/kernels/tables/<device kind>.json`).

Every key is tuned exhaustively, so each entry also records every candidate's time: the
replay of warm starts (`benchmarks/warm_replay.py`,
`tests/tuning/test_warm_start_replay.py`) reads them. A release tool, not a benchmark:
run it on each GPU model the package supports, from the repository root:

    PYTHONPATH=. python -m tools.ship_tables [--ops matmul,layer_norm,...,blocks]
    PYTHONPATH=. python -m tools.ship_tables --ops blocks --missing-only  # new keys only

On a host with several GPUs, one process a GPU, each tuning a disjoint part of the
run's calls (`--shard I/N`, 1-based: `1/4` to `4/4`) into a table file of its own;
`tools.merge_tables` then writes the package table from those files:

    OPS=ragged_dot,ragged_dot_grad OUT=/tmp/ship
    for i in 1 2 3 4; do
      CUDA_VISIBLE_DEVICES=$((i - 1)) PYTHONPATH=. python -m tools.ship_tables \
        --ops $OPS --shard $i/4 --out $OUT/shard$i.json --cache $OUT/cache$i &
    done; wait
    PYTHONPATH=. python -m tools.merge_tables $OUT/shard*.json

Entries are written to a cache directory as they finish (`--cache`), and the table is
written when the run ends, also when stopped part-way (Ctrl-C), so an interrupted run
keeps what it tuned.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

import kerneltune as kt
import kerneltune.kernels
from benchmarks import harness as h
from kerneltune._src.caching import storage
from kerneltune._src.caching.shipped import PACKAGE_TABLES, ShippedTables, device_kind_of
from kerneltune._src.core import devices
from kerneltune.kernels.ragged_dot import shapes as ragged_shapes

Call = Callable[[kt.Executor], Any]
T = TypeVar("T")

#: Matmul: rows from 512 to 8192 against three weight shapes (k, n).
MATMUL = [
    (m, k, n)
    for k, n in ((4096, 4096), (4096, 1024), (1024, 4096))
    for m in (512, 1024, 2048, 4096, 8192)
]
#: Norms and softmax: rows × width.
ROWS = [(r, w) for w in (1024, 2048, 4096, 8192, 16384) for r in (4096, 16384)]
#: Attention: (batch, sequence, heads, head dim, causal), batch × sequence = 16k tokens.
ATTENTION = [
    (16384 // t, t, 16, d, c)
    for t in (1024, 2048, 4096, 8192)
    for d in (64, 128)
    for c in (False, True)
]
#: Grouped matmul (MoE experts): (m routed rows, k, n, experts), skewed routing with one
#: empty expert, as `benchmarks/first_call_gpu.py` calls it (whose held-out `RAGGED`
#: shapes these must not be: `tests/tuning/test_ship_tables.py`). Ordered by experts,
#: then rows, so that `--shard` (every N-th call) gives each shard a mix of both. Equal
#: counts of keys are what make shards take similar times: a key's exhaustive tuning is
#: mostly compiling its candidates (the H200 table's matmul keys took 9-12 s each over a
#: 40x range of kernel times), not its FLOPs.
RAGGED = [
    (m, k, n, g)
    for g in (8, 16, 32, 64, 128, 256)
    for m in (8192, 32768)
    for k, n in ((1024, 1024), (2048, 512), (4096, 2048))
]


def grid(op: str, rows: frozenset[str] = frozenset()) -> Iterator[tuple[str, Call]]:
    """The calls whose keys `op` ships, each with a label; `rows` picks demo rows."""
    if op == "matmul":
        for m, k, n in MATMUL:
            a, b = h.normal(0, (m, k)), h.normal(1, (k, n))
            yield f"{m}x{k}x{n}", lambda ex, a=a, b=b: kt.kernels.matmul(a, b, executor=ex)
    elif op in ("layer_norm", "rms_norm", "softmax"):
        fn = getattr(kt.kernels, op)
        # The norms' scale and bias are random too: left out, they are filled with ones
        # and zeros (the same key), and the tuner warns that zeros can flatter timings.
        params = {"layer_norm": 2, "rms_norm": 1, "softmax": 0}[op]
        for r, w in ROWS:
            arrays = (h.normal(0, (r, w)), *(h.normal(1 + i, (w,)) for i in range(params)))

            def rows_call(ex: kt.Executor, arrays: tuple[Any, ...] = arrays) -> Any:
                return fn(*arrays, executor=ex)

            yield f"{r}x{w}", rows_call
    elif op in ("attention", "attention_grad"):
        for b, t, n, d, causal in ATTENTION[:: 1 if op == "attention" else 2]:
            q, k, v = (h.normal(i, (b, t, n, d)) for i in range(3))

            def call(ex: kt.Executor, q=q, k=k, v=v, causal=causal) -> Any:
                f = lambda q, k, v: kt.kernels.attention(q, k, v, is_causal=causal, executor=ex)  # noqa: E731
                if op == "attention":
                    return f(q, k, v)
                return jax.grad(lambda *a: f(*a).astype("float32").sum(), argnums=(0, 1, 2))(
                    q, k, v
                )

            yield f"B{b} T{t} N{n} H{d}{' causal' if causal else ''}", call
    elif op in ("ragged_dot", "ragged_dot_grad"):
        yield from ragged_grid(grad=op == "ragged_dot_grad")
    elif op == "blocks":
        # The training steps of the model benchmarks' blocks (`first_use_gpu`,
        # `model_gpu`): every key a user's first step at these sizes looks up.
        from benchmarks import first_use_gpu
        from benchmarks import model_blocks as mb

        for name in ("gpt", "llama"):
            block, shape = first_use_gpu.BLOCKS[name]
            args = mb.block_inputs(block, shape)

            def step(ex: kt.Executor, block=block, shape=shape, args=args) -> Any:
                return mb.train_step(block, mb.kerneltune_ops(ex), shape)(*args)

            yield f"{name} {shape}", step
    elif op == "demo":
        # Every row of `kerneltune demo` (its GPU shapes): a user's first demo then reads
        # its configs from the table instead of tuning on the first call.
        from kerneltune._src.cli import demo_cases

        for case in demo_cases.cases(on_gpu=True):
            if rows and case.name not in rows:
                continue
            args = case.args(0)

            def row(ex: kt.Executor, case=case, args=args) -> Any:
                return jax.jit(case.kerneltune(ex))(*args)

            yield case.name, row
    elif op == "moe_example":
        # The training step `python -m examples.moe.train` runs on a GPU.
        from examples.moe import model as moe

        s = moe.GPU_SHAPES[0]
        params, (x, target) = moe.init_params(s), moe.inputs(s)

        def moe_step(ex: kt.Executor) -> Any:
            return jax.jit(moe.train_step(moe.kerneltune_ops(ex), s))(params, x, target)

        yield f"moe {s.name}", moe_step
    elif op in ("llama_example", "gpt_example"):
        # `python -m examples.llama_nnx.train` / `examples.gpt_equinox.train` on a GPU:
        # they call `kerneltune.kernels` through the default executor, which is `ex`
        # while their training step runs once.
        from examples import compare

        if op == "llama_example":
            from examples.llama_nnx.model import LlamaConfig as Config
            from examples.llama_nnx.train import make_step
        else:
            from examples.gpt_equinox.model import GPTConfig as Config
            from examples.gpt_equinox.train import make_step
        config = Config()

        def example_step(ex: kt.Executor, make_step=make_step, config=config) -> Any:
            step, state, opt_state = make_step(config, kerneltune.kernels)
            x, y = compare.batch(config.dim, config.dtype, *compare.GPU_BATCH)
            kt.set_default_executor(ex)
            try:
                return step(state, opt_state, x, y)
            finally:
                kt.set_default_executor(None)

        yield op, example_step
    else:
        raise SystemExit(f"--ops: unknown op {op!r}")


def ragged_grid(*, grad: bool) -> Iterator[tuple[str, Call]]:
    """`RAGGED`'s forward calls, or (`grad`) the gradient with respect to both operands
    (keys ragged_dot_dlhs and ragged_dot_drhs) at every other shape, as attention_grad:
    neighbours for the backward keys at half the tuning time."""
    for m, k, n, g in RAGGED[:: 2 if grad else 1]:

        def call(ex: kt.Executor, m=m, k=k, n=n, g=g) -> Any:
            # Inputs made when the call runs: a shard (`--shard`) skips most calls, and
            # the largest shapes' inputs are gigabytes.
            lhs, rhs = h.normal(0, (m, k)), h.normal(1, (g, k, n))
            sizes = jnp.asarray(ragged_shapes.skewed(m, g, empty=1), jnp.int32)
            f = lambda lhs, rhs: kt.kernels.ragged_dot(lhs, rhs, sizes, executor=ex)  # noqa: E731
            if not grad:
                return f(lhs, rhs)
            return jax.grad(lambda *a: f(*a).astype("float32").sum(), argnums=(0, 1))(lhs, rhs)

        yield f"{m}x{k}x{n} G{g}", call


@dataclasses.dataclass(frozen=True)
class Shard:
    """Part `index` (1-based) of `count` of a run's calls."""

    index: int
    count: int


def parse_shard(text: str) -> Shard:
    """`--shard I/N`: part I of N, 1 <= I <= N."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        index = count = 0
    if count < 1 or not 1 <= index <= count:
        raise argparse.ArgumentTypeError(
            f"--shard {text!r}: expected I/N with 1 <= I <= N (1-based: 1/4 to 4/4)"
        )
    return Shard(index, count)


def in_shard(calls: Iterable[T], shard: Shard | None) -> Iterator[T]:
    """Every `shard.count`-th of `calls`, from the `shard.index`-th: the shards of one
    sequence are disjoint and cover it, their sizes at most one apart, and interleaved
    they share its cheap and dear calls alike (where contiguous parts would not)."""
    if shard is None:
        return iter(calls)
    return itertools.islice(calls, shard.index - 1, None, shard.count)


def table_path(kind: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")
    return str(PACKAGE_TABLES / f"{slug}.json")


def _identity(doc: dict[str, Any]) -> tuple[Any, ...]:
    return doc["op_id"], doc["call_key"], doc["dev"]


def write_table(cache: kt.PersistentCache[Any], path: str) -> int:
    """The cache's entries as a shipped table: provenance "shipped", each candidate's
    median time kept and its samples left out (the file stays small). Entries of the
    table already at `path` that this run did not tune again are kept."""
    docs = []
    for entry in sorted(cache.entries(), key=lambda e: (e.op_id_v, e.signature)):
        doc = entry.to_document()
        doc["provenance"] = "shipped"
        doc["candidates"] = [
            {k: v for k, v in c.items() if k != "samples_s"} for c in doc["candidates"]
        ]
        docs.append(doc)
    if os.path.exists(path):
        with open(path) as f:
            kept = json.load(f).get("entries", [])
        tuned = {_identity(d) for d in docs}
        docs = [d for d in kept if _identity(d) not in tuned] + docs
    os.makedirs(os.path.dirname(path), exist_ok=True)
    storage.write_export_file(path, docs, exported=time.time())
    return len(docs)


class ListedOnly:
    """A table's own keys and nothing near them. With `--missing-only` every key the
    table lacks is tuned and added, even one its nearest entry would answer: a chain
    given the tables themselves answers a key near one whose other backends were 2x
    behind, untuned (`tiers.NearShipped`), and the table would never record it."""

    def __init__(self, table: ShippedTables) -> None:
        self._table = table

    def get(self, dev: str, op_id_v: str, call_key: str, cfg_type: type[Any] | None) -> Any:
        return self._table.get(dev, op_id_v, call_key, cfg_type)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="matmul,layer_norm,rms_norm,softmax,attention")
    p.add_argument("--cache", default=None, help="cache directory (default: a new temporary one)")
    p.add_argument("--out", default=None, help="table file (default: the package's, for this GPU)")
    p.add_argument("--rows", default="", help="with --ops demo: only these rows (NAME,...)")
    p.add_argument(
        "--key-budget", type=float, default=None, help="seconds a key (default: no limit)"
    )
    p.add_argument(
        "--missing-only",
        action="store_true",
        help="tune only the keys the table at --out does not hold (e.g. keys a new "
        "version of an op asks for); the others are read from it",
    )
    p.add_argument(
        "--shard",
        type=parse_shard,
        default=None,
        metavar="I/N",
        help="only every N-th call of the run, from the I-th (1-based), e.g. one process "
        "a GPU, each with --shard I/4 and its own --out; merge with tools.merge_tables",
    )
    args = p.parse_args(argv)
    if args.shard and not args.out:
        # Shards writing one file would each rewrite it with their own entries only.
        p.error("--shard needs an --out file of its own (merge them with tools.merge_tables)")
    if not h.on_gpu():
        print("ship_tables: no GPU found; tables are only written on the GPU they describe.")
        return
    kind = device_kind_of(devices.device_fingerprint())
    out = args.out or table_path(kind)
    cache: kt.PersistentCache[Any] = kt.PersistentCache(
        args.cache or tempfile.mkdtemp(prefix="kt-ship-")
    )
    held = ListedOnly(ShippedTables([out])) if args.missing_only and os.path.exists(out) else None
    chain: kt.ConfigSelectorChain[Any, Any] = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        tuner=kt.Tuner(strategy="exhaustive", time_budget_s=args.key_budget, progress=False),
        persistent=cache,
        shipped=held,
    )
    ex = kt.Executor(chain)
    part = f", shard {args.shard.index}/{args.shard.count}" if args.shard else ""
    print(f"{kind}: tuning into {cache.location}, table {out}{part}", flush=True)
    rows = frozenset(filter(None, args.rows.split(",")))
    calls = ((op, label, call) for op in args.ops.split(",") for label, call in grid(op, rows))
    try:
        untuned = run_calls(in_shard(calls, args.shard), ex, cache)
    finally:  # also when stopped part-way (Ctrl-C): the keys tuned so far are kept
        print(f"{write_table(cache, out)} entries in {out}", flush=True)
    if untuned:
        print(
            f"{len(untuned)} call(s) added no key to the table: {', '.join(untuned)}. "
            "Each key they asked for was already held (--missing-only), failed, or had "
            "one candidate, the heuristic's, which every process chooses untimed.",
            flush=True,
        )


def run_calls(
    calls: Iterable[tuple[str, str, Call]], ex: kt.Executor, cache: kt.PersistentCache[Any]
) -> list[str]:
    """Runs each `(op, label, call)` through `ex`, printing its time and how many keys
    it added to `cache`; returns the labels of the calls that added none (a table
    that stays empty is otherwise found out only when it is shipped)."""
    untuned = []
    held = len(cache)
    for op, label, call in calls:
        start = time.perf_counter()
        try:
            jax.block_until_ready(call(ex))
            note = ""
        except Exception as e:  # one shape failing keeps the rest
            note = f"  FAILED: {h.error_text(e)}"
        took = time.perf_counter() - start
        now = len(cache)
        print(f"{op:14s} {label:28s} {took:6.1f} s  +{now - held} keys{note}", flush=True)
        if now == held:
            untuned.append(f"{op} {label}")
        held = now
    return untuned


if __name__ == "__main__":
    sys.exit(main())
