"""Where kerneltune's Mosaic GPU attention spends its time, part by part.

For causal attention over T tokens packed into documents (segment ids), each part is
its own jitted program, the parts timed in interleaved rounds (CUPTI device time on a
GPU; one round with `--smoke`):

- `ranges`: the XLA code that finds which key blocks each query block visits
  (`mosaic_flash_layout.block_ranges`) and puts the blocks in work order, most visits
  first (`in_work_order`), run before the kernels;
- `forward kernel`, `backward kernels`: the Mosaic kernels alone, on those ranges;
- `... in position order`: the same kernels given the blocks in position order (what
  the kernels did before `in_work_order`), for the difference the order makes;
- `... each head in turn`: the kernels launched head by head (`FlashShape.heads_outermost=True`),
  where the default launches each row of the work order for every head, one order
  over all the heads' blocks;
- `whole forward`, `whole training step`: `flash_attention_mosaic` as a call runs it,
  and the gradient of a sum of it.

With `--first-call`, also the first call of a training step, split into lowering,
compiling and the first run, for the kernel and for the peers (cuDNN and tokamax given
the documents' dense mask), each a fresh `jax.jit` in this process.

    python -m benchmarks.mosaic_attention_parts_gpu --length 8192 --docs 1,4,16 --first-call

`--smoke` runs tiny shapes in JAX's Mosaic GPU interpreter on a CPU: it exercises the
code, its times mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import attention_variants_gpu as variants
from benchmarks import harness as h
from kerneltune._src.core import jax_compat
from kerneltune.kernels.attention.masking import Masks
from kerneltune.kernels.attention.mosaic_flash import flash_forward
from kerneltune.kernels.attention.mosaic_flash_api import flash_attention_mosaic
from kerneltune.kernels.attention.mosaic_flash_backward import flash_backward
from kerneltune.kernels.attention.mosaic_flash_layout import (
    FlashShape,
    block_ranges,
    in_work_order,
)

HEADS, KV_HEADS, HEAD_DIM = 16, 4, 128
#: Rounds of the parts' interleaved timing (`harness.interleaved_times`).
ROUNDS = 5


def parts(t: int, docs: int, interpret: Any = None) -> dict[str, Any]:
    """Seconds of each part at `t` tokens in `docs` documents, and the block pairs the
    kernels visit (all, and whole: run unmasked)."""
    b, n, kv, d = 1, HEADS, KV_HEADS, HEAD_DIM
    q, k, v = h.normal(0, (b, t, n, d)), h.normal(1, (b, t, kv, d)), h.normal(2, (b, t, kv, d))
    do = h.normal(3, (b, t, n, d))
    ids = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32) * docs // t, (b, t))
    lens = jnp.asarray([[t, t]], jnp.int32)
    shape = FlashShape(64, 64, d, n // kv, True, None, None, d**-0.5, True)

    def masks(ids):
        return Masks(q_segments=ids, kv_segments=ids)

    def call(q, k, v, ids):
        return flash_attention_mosaic(
            q, k, v, masks(ids), scale=d**-0.5, causal=True, window=None, soft_cap=None,
            interpret=interpret,
        )  # fmt: skip

    def ordered(ids):
        return tuple(in_work_order(r) for r in block_ranges(shape, lens, masks(ids), t, t))

    def in_position_order(r):  # the blocks as the grid numbers them
        blocks = jnp.broadcast_to(jnp.arange(r.shape[1], dtype=jnp.int32), r.shape[:2])
        return jnp.concatenate([r, blocks[..., None]], axis=-1)

    ranges = jax.jit(ordered)
    kv_ranges, q_ranges = ranges(ids)
    kv_plain, q_plain = (
        in_position_order(r) for r in jax.jit(block_ranges, static_argnums=(0, 3, 4))(
            shape, lens, masks(ids), t, t
        )
    )  # fmt: skip

    def forward_in(order):
        return jax.jit(
            lambda q, k, v, r, ids: flash_forward(
                order, q, k, v, r, lens, ids, ids, alike, interpret=interpret
            )
        )

    alike = jnp.mean(v, axis=1, dtype=jnp.float32)  # what rows that keep no key get
    in_turn = dataclasses.replace(shape, heads_outermost=True)
    forward, forward_in_turn = forward_in(shape), forward_in(in_turn)
    out, lse = forward(q, k, v, kv_ranges, ids)
    delta = jnp.einsum("btnd,btnd->bnt", do.astype(jnp.float32), out.astype(jnp.float32))

    def backward_in(order):
        return jax.jit(
            lambda q, k, v, do, lse, delta, kr, qr, ids: flash_backward(
                order, q, k, v, do, lse, delta, kr, qr, lens, ids, ids, interpret=interpret
            )
        )

    backward, backward_in_turn = backward_in(shape), backward_in(in_turn)
    train = jax.jit(jax.grad(lambda *a: call(*a).astype(jnp.float32).sum(), (0, 1, 2)))
    bwd_args = (q, k, v, do, lse, delta)
    parts = {
        "ranges": (ranges, (ids,)),
        "forward kernel": (forward, (q, k, v, kv_ranges, ids)),
        "backward kernels": (backward, (*bwd_args, kv_ranges, q_ranges, ids)),
        "forward kernel in position order": (forward, (q, k, v, kv_plain, ids)),
        "forward kernel each head in turn": (forward_in_turn, (q, k, v, kv_ranges, ids)),
        "backward kernels in position order": (backward, (*bwd_args, kv_plain, q_plain, ids)),
        "backward kernels each head in turn": (
            backward_in_turn,
            (*bwd_args, kv_ranges, q_ranges, ids),
        ),
        "whole forward": (jax.jit(call), (q, k, v, ids)),
        "whole training step": (train, (q, k, v, ids)),
    }
    # In interleaved rounds, so that the orders compared are timed under the same clocks.
    sessions = {name: h.session(fn, [args]) for name, (fn, args) in parts.items()}
    seconds = h.interleaved_times(sessions, rounds=1 if interpret is not None else ROUNDS)
    visited = int((kv_ranges[..., 1] - kv_ranges[..., 0]).sum())
    whole = int((kv_ranges[..., 3] - kv_ranges[..., 2]).sum())
    return {"docs": docs, "pairs": visited, "whole": whole, "seconds": seconds}


def first_call_split(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[float, float, float]:
    """Wall seconds of a fresh `jax.jit(fn)`'s lowering, compiling and first run."""
    t0 = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    t3 = time.perf_counter()
    jax.clear_caches()
    return t1 - t0, t2 - t1, t3 - t2


def first_calls(t: int, docs: int) -> list[tuple[str, tuple[float, float, float]]]:
    """The training step's first call, split, for the Mosaic kernel and the peers."""
    b, n, kv, d = 1, HEADS, KV_HEADS, HEAD_DIM
    static, arrays = variants.call_parts(f"docs{docs}", b, t, n)
    args = (h.normal(0, (b, t, n, d)), h.normal(1, (b, t, kv, d)), h.normal(2, (b, t, kv, d)))
    impls = variants.implementations(static, docs=True)
    out = []
    for name in ("cudnn", "tokamax", "kt_mosaic"):
        fn = impls.get(name)
        if fn is not None:
            out.append((name, first_call_split(variants.training(fn), (*args, arrays))))
    return out


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--length", type=int, default=8192, help="tokens T (default 8192)")
    p.add_argument("--docs", default="1,4,16", help="documents per sequence, comma-separated")
    p.add_argument("--first-call", action="store_true", help="also split the first calls")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, interpreted (any device)")
    a = p.parse_args(argv)
    interpret = jax_compat.mosaic_gpu_interpret_params() if a.smoke else None
    t = 128 if a.smoke else a.length
    rows = [parts(t, int(x), interpret) for x in a.docs.split(",")]
    names = list(rows[0]["seconds"])
    print(f"T{t}, B1, {HEADS}/{KV_HEADS} heads, head dim {HEAD_DIM}, causal, packed documents")
    print("| docs | block pairs (whole) | " + " | ".join(f"{n} ms" for n in names) + " |")
    print("|---" * (len(names) + 2) + "|")
    for r in rows:
        cells = " | ".join(f"{1e3 * r['seconds'][n]:.3f}" for n in names)
        print(f"| {r['docs']} | {r['pairs']} ({r['whole']}) | {cells} |")
    if a.first_call and not a.smoke:
        print("\nFirst call of a training step (lower / compile / first run, seconds):")
        for docs in a.docs.split(","):
            for name, (lower, compile_s, run) in first_calls(t, int(docs)):
                total = lower + compile_s + run
                print(
                    f"  {docs} docs, {name}: {lower:.2f} / {compile_s:.2f} / {run:.2f}, total {total:.2f}"
                )
    return rows


if __name__ == "__main__":
    main()
