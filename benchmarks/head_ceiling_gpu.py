"""How much faster any loss head could make a training step: the ceiling behind issue 29's
"small model ≥ 1.05× plain JAX" target.

    python -m benchmarks.head_ceiling_gpu [--rounds N] [--no-model]
    python -m benchmarks.head_ceiling_gpu --kernels DIR   # each head's kernels, timed
    python -m benchmarks.head_ceiling_gpu --smoke      # tiny shapes, any device, wall clock

A loss head over M tokens, K features and a vocabulary of V must multiply out three
products of M·K·V each: the logits (x·W), d_x (G·Wᵀ) and d_W (xᵀ·G), where G is the
logits' gradient. A head that recomputes the logits in its backward does four. So no
head built on matmuls at cuBLAS's speed runs faster than those three products alone,
timed here by themselves (G a random bf16 `[M, V]` argument): its softmax, log-sum-exp
and one-hot work all hidden. Per shape, in one process and in interleaved rounds:
plain JAX's head (16-bit logits, the faster plain form; forward + backward of the mean
loss), kerneltune's head (heuristic config), the three products, and the logits
product alone. Then the small model of `loss_head_gpu` (two Llama blocks and a
128k-vocabulary head): plain JAX's step and kerneltune's, and the step's ceiling with a
head that costs only its three products, `step ÷ (step − (plain head − products))`.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import harness as h
from benchmarks import loss_head_gpu as lh
from benchmarks import model_blocks as mb
from benchmarks import op_bench
from kerneltune import kernels as ktk
from kerneltune.kernels.cross_entropy import config as cc

#: (tokens, features, vocabulary): the small model's head (B4 T2048 D2048, 128k), then
#: the loss head benchmark's shapes.
SHAPES = ((8192, 2048, 128256), (16384, 2048, 128256), (8192, 4096, 32000), (8192, 4096, 256000))
SMOKE_SHAPES = ((64, 32, 256),)


def three_products(x: jax.Array, w: jax.Array, g: jax.Array) -> tuple[jax.Array, ...]:
    """The products every head runs, in the dtypes plain JAX's head runs them."""
    return jnp.dot(x, w), jnp.dot(g, w.T), jnp.dot(x.T, g)


def xla_lse_cfg(m: int, k: int, v: int) -> cc.CrossEntropyConfig:
    """The heuristic's config under a gradient with XLA's log-sum-exp reduction: the
    head as it ran before the Pallas pass."""
    p = cc.CrossEntropyProblem(m, k, v, jnp.dtype(jnp.bfloat16))
    return cc.heuristic(p, training=True, lse_backend="xla")


def head_rows(
    shape: tuple[int, int, int], rounds: int, chunks: Sequence[int] = (), xla_lse: bool = False
) -> dict[str, float]:
    m, k, v = shape
    heuristic = op_bench.heuristic_executor()

    def kt_loss(cfg: Any = None) -> Callable[..., jax.Array]:
        return lambda x, labels, w: ktk.linear_softmax_cross_entropy(
            x, labels, w, cfg=cfg, executor=heuristic
        )

    def make(seed: int) -> tuple[Any, ...]:
        labels = jax.random.randint(jax.random.key(seed), (m,), 0, v)
        return h.normal(3 * seed, (m, k)), labels, h.normal(3 * seed + 1, (k, v)) * 0.05

    def make_products(seed: int) -> tuple[Any, ...]:
        return (
            h.normal(3 * seed, (m, k)),
            h.normal(3 * seed + 1, (k, v)),
            h.normal(3 * seed + 2, (m, v)),
        )

    sets, product_sets = h.arg_sets(make), h.arg_sets(make_products)
    fns: dict[str, tuple[Callable[..., Any], Sequence[Any]]] = {
        "plain head": (lh.with_backward("loss_head", lh.plain_loss_bf16_logits), sets),
        "kt head": (lh.with_backward("loss_head", kt_loss()), sets),
        "3 products": (three_products, product_sets),
        "logits product": (lambda x, w, g: jnp.dot(x, w), product_sets),
    }
    for c in chunks:
        cfg = cc.chunked(min(c, m), "input")
        fns[f"kt chunk {cfg.chunk_size}"] = (lh.with_backward("loss_head", kt_loss(cfg)), sets)
    if xla_lse:
        fns["kt xla-lse"] = (lh.with_backward("loss_head", kt_loss(xla_lse_cfg(*shape))), sets)
    sessions, extra = {}, {}
    for name, (fn, s) in fns.items():
        compiled, extra[f"{name} first"] = lh.compile_and_run(fn, s[0])
        sessions[name] = lh.compiled_session(compiled, s)
        extra[f"{name} peak"] = lh.peak_bytes(compiled)
    return {**h.interleaved_times(sessions, rounds=rounds), **extra}


def kernel_breakdown(shape: tuple[int, int, int], out_dir: str) -> None:
    """Plain JAX's and kerneltune's heads at `shape`, kernel by kernel (CUPTI, one
    call): where the time beyond the three products goes. Each program's optimised
    HLO is written to `out_dir` to read the fusions' names against."""
    import os

    from jax.experimental.mosaic.gpu import profiler

    m, k, v = shape
    heuristic = op_bench.heuristic_executor()
    labels = jax.random.randint(jax.random.key(0), (m,), 0, v)
    args = (h.normal(0, (m, k)), labels, h.normal(1, (k, v)) * 0.05)
    heads = {
        "plain": lh.plain_loss_bf16_logits,
        "kt": lambda x, labels, w: ktk.linear_softmax_cross_entropy(
            x, labels, w, executor=heuristic
        ),
    }
    os.makedirs(out_dir, exist_ok=True)
    for name, loss in heads.items():
        compiled, _ = lh.compile_and_run(lh.with_backward("loss_head", loss), args)
        with open(os.path.join(out_dir, f"{name}_{m}x{k}x{v}.hlo.txt"), "w") as f:
            f.write(compiled.as_text())
        _, per_kernel = profiler.measure(h._Cycle(compiled, [args]), aggregate=False)()
        total = sum(ms for _, ms in per_kernel)
        print(f"\n{name} head {m} x {k} -> {v}: {len(per_kernel)} kernels, {total:.2f} ms")
        for kernel, ms in sorted(per_kernel, key=lambda t: -t[1]):
            print(f"  {ms:8.3f} ms  {kernel[:110]}")


def model_rows(
    s: lh.ModelShape, rounds: int, chunks: Sequence[int] = (), xla_lse: bool = False
) -> dict[str, float]:
    args = lh.model_args(s)
    heuristic = op_bench.heuristic_executor()
    variants = {
        "plain step": (mb.plain_ops(), lh.plain_loss_bf16_logits),
        "kt step": (
            mb.kerneltune_ops(heuristic),
            functools.partial(ktk.linear_softmax_cross_entropy, executor=heuristic),
        ),
    }
    for c in chunks:
        cfg = cc.chunked(min(c, s.block.batch * s.block.seq), "input")
        variants[f"kt step chunk {cfg.chunk_size}"] = (
            mb.kerneltune_ops(heuristic),
            functools.partial(ktk.linear_softmax_cross_entropy, cfg=cfg, executor=heuristic),
        )
    if xla_lse:
        cfg = xla_lse_cfg(s.block.batch * s.block.seq, s.block.dim, s.vocab)
        variants["kt step xla-lse"] = (
            mb.kerneltune_ops(heuristic),
            functools.partial(ktk.linear_softmax_cross_entropy, cfg=cfg, executor=heuristic),
        )
    sessions, extra = {}, {}
    for name, (ops, loss) in variants.items():
        compiled, extra[f"{name} first"] = lh.compile_and_run(lh.model_step(ops, loss, s), args)
        sessions[name] = lh.compiled_session(compiled, [args])
        extra[f"{name} peak"] = lh.peak_bytes(compiled)
    return {**h.interleaved_times(sessions, rounds=rounds), **extra}


def n_suffixed(name: str) -> bool:
    """A first-call or peak entry, not a time."""
    return name.endswith((" first", " peak"))


def chunk_names(t: dict[str, float]) -> list[str]:
    """The extra variants' names: chunk sizes and XLA's log-sum-exp."""
    return [n for n in t if n.startswith(("kt chunk", "kt xla-lse")) and not n_suffixed(n)]


def variant_line(t: dict[str, float], name: str, plain: str) -> str:
    """One variant's time, peak and first-call wall, each against plain's."""
    ms, peak, first = t[name], t[f"{name} peak"], t[f"{name} first"]
    return (
        f"{name}: {ms * 1e3:.2f} ms ({t[plain] / ms:.3f}x plain), peak {peak / 2**30:.2f} "
        f"GiB ({peak / max(t[f'{plain} peak'], 1):.0%} of plain's), first call {first:.1f} s "
        f"({first / t[f'{plain} first']:.2f}x plain's)"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes (any device)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--no-model", action="store_true", help="the heads only")
    p.add_argument("--heads", type=int, default=None, help="only the first N head shapes")
    p.add_argument("--kernels", metavar="DIR", help="only the kernel breakdown, HLO to DIR")
    p.add_argument(
        "--chunks",
        default="",
        help="also time kerneltune's chunked head at these chunk sizes (comma-separated; "
        "one larger than the tokens is one chunk)",
    )
    p.add_argument(
        "--xla-lse",
        action="store_true",
        help="also time kerneltune's heuristic config with XLA's log-sum-exp reduction",
    )
    args = p.parse_args(argv)
    if args.kernels:
        for shape in SMOKE_SHAPES if args.smoke else SHAPES[:1]:
            kernel_breakdown(shape, args.kernels)
        return {}
    shapes = (SMOKE_SHAPES if args.smoke else SHAPES)[: args.heads]
    chunks = [int(c) for c in args.chunks.split(",") if c]
    out: dict[str, Any] = {}
    print(
        "head M x K -> V | plain head ms | kt head ms (x plain) | 3 products ms | "
        "logits product ms | plain's non-product share | head ceiling x plain"
    )
    for shape in shapes:
        t = head_rows(shape, args.rounds, chunks, args.xla_lse)
        out[shape] = t
        plain, kt, products = t["plain head"], t["kt head"], t["3 products"]
        print(
            f"{shape[0]} x {shape[1]} -> {shape[2]} | {plain * 1e3:.2f} | {kt * 1e3:.2f} "
            f"({plain / kt:.3f}) | {products * 1e3:.2f} | {t['logits product'] * 1e3:.2f} | "
            f"{(plain - products) / plain:.1%} | {plain / products:.3f}",
            flush=True,
        )
        for name in ("plain head", "kt head", *chunk_names(t)):
            print(f"    {variant_line(t, name, 'plain head')}", flush=True)
    if not args.no_model:
        s = lh.MODEL_SMOKE if args.smoke else lh.MODEL
        head = (s.block.batch * s.block.seq, s.block.dim, s.vocab)
        t = out[head] if head in out else head_rows(head, args.rounds)
        steps = model_rows(s, args.rounds, chunks, args.xla_lse)
        out["model"] = steps
        plain, kt = steps["plain step"], steps["kt step"]
        overhead = t["plain head"] - t["3 products"]
        print(
            f"\nmodel {s}: plain step {plain * 1e3:.2f} ms, kt step {kt * 1e3:.2f} ms "
            f"({plain / kt:.3f}x plain); plain head {t['plain head'] * 1e3:.2f} ms "
            f"({t['plain head'] / plain:.0%} of the step), its non-product work "
            f"{overhead * 1e3:.2f} ms; step ceiling with a head at its three products' "
            f"time: {plain / (plain - overhead):.3f}x plain",
            flush=True,
        )
        for name in (n for n in steps if not n_suffixed(n)):
            print(f"    {variant_line(steps, name, 'plain step')}", flush=True)
    return out


if __name__ == "__main__":
    main()
