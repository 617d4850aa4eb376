"""Trains the expert-parallel mixture-of-experts block a few steps on each ops namespace
(`jax.lax.ragged_dot`, kerneltune's, tokamax's where it imports) and prints the losses
and the step time.

One process over the local devices (every device on the expert axis by default):

    python -m examples.moe_ep.train [--shape tiny|fine|coarse] [--expert E] [--data D]
        [--dispatch auto|ragged|dense|gather] [--capacity-factor C] [--steps N]

One process per GPU (each runs `jax.distributed.initialize` first; the mesh spans every
process's devices, and every process prints the same losses):

    python -m examples.moe_ep.train --coordinator HOST:PORT --num-processes N \\
        --process-id I [...]     # e.g. CUDA_VISIBLE_DEVICES=I for process I

On a CPU: `XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m
examples.moe_ep.train` (the tiny block, the dense all-to-all, the default everywhere). `--check` compares the first loss with the unsharded block's.
`benchmarks/expert_parallel_gpu.py` times the block at real sizes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

#: The block per shape name: tokens are per device (weak scaling), the rest as
#: `examples/moe/model.py`'s GPU shapes (fine: 64 experts top-8 D2048; coarse: 8 experts
#: top-2 D4096).
SHAPES = {
    "tiny": dict(tokens=16, d=16, f=24, experts=8, top_k=2, skew=1.0),
    "fine": dict(tokens=4096, d=2048, f=1408, experts=64, top_k=8),
    "coarse": dict(tokens=8192, d=4096, f=14336, experts=8, top_k=2),
}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--shape", choices=sorted(SHAPES), default=None, help="default: tiny off GPUs, else fine"
    )
    p.add_argument(
        "--expert", type=int, default=None, help="expert-axis devices (default: all / data)"
    )
    p.add_argument("--data", type=int, default=1, help="data-axis devices")
    p.add_argument("--dispatch", default="auto", choices=("auto", "ragged", "dense", "gather"))
    p.add_argument("--capacity-factor", type=float, default=None)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--ops",
        default="jax,kerneltune,tokamax",
        help="namespaces to run (tokamax where it imports)",
    )
    p.add_argument(
        "--check", action="store_true", help="compare the first loss with the unsharded block's"
    )
    p.add_argument("--coordinator", help="HOST:PORT of process 0: one process per GPU")
    p.add_argument("--num-processes", type=int, default=None)
    p.add_argument("--process-id", type=int, default=None)
    return p.parse_args(argv)


def initialize(args: argparse.Namespace) -> None:
    """`jax.distributed.initialize` for a multi-process run (before JAX does anything
    else). On CPUs the processes' collectives go through gloo."""
    if not args.coordinator:
        return
    import jax

    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )


def scalar(x: Any) -> float:
    """A replicated scalar's value, in one process or many."""
    return float(np.asarray(x.addressable_shards[0].data))


def namespaces(names: Sequence[str]) -> list[Any]:
    """The ops namespaces named (tokamax only where it imports)."""
    from examples.moe import model as moe

    out = []
    for name in names:
        if name == "jax":
            out.append(moe.jax_ops())
        elif name == "kerneltune":
            out.append(moe.kerneltune_ops())
        elif name == "tokamax":
            try:
                out.append(moe.tokamax_ops(importlib.import_module("tokamax")))
            except Exception as e:  # absent, or present without its dependencies
                print(f"tokamax unavailable ({type(e).__name__}: {e}): not run", file=sys.stderr)
        else:
            raise SystemExit(f"--ops: unknown {name!r}; choose from jax, kerneltune, tokamax")
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Returns, per namespace, its losses and median step seconds."""
    args = parse(argv)
    initialize(args)
    import jax
    import jax.numpy as jnp

    from examples.moe import model as moe
    from examples.moe_ep import model as ep

    on_gpu = jax.default_backend() == "gpu"
    shape = args.shape or ("fine" if on_gpu else "tiny")
    devices = jax.device_count()
    expert = args.expert or devices // args.data
    fields = dict(SHAPES[shape])
    fields["tokens"] *= expert * args.data  # tokens per device fixed
    s = moe.MoEShape(shape, **fields)  # type: ignore[arg-type]
    dtype = jnp.bfloat16 if shape != "tiny" else jnp.float32
    cfg = ep.EPConfig(dispatch=args.dispatch, capacity_factor=args.capacity_factor)
    mesh = ep.make_mesh(expert, args.data, cfg=cfg)
    params = moe.init_params(s, dtype)
    x, target = moe.inputs(s, dtype)
    placed, xs, ts = ep.shard(mesh, cfg, params, x, target)
    lead = jax.process_index() == 0
    if lead:
        print(
            f"{s}: {jax.process_count()} process(es), mesh {dict(mesh.shape)}, "
            f"{jax.devices()[0].device_kind}"
        )
    results: dict[str, Any] = {}
    for ops in namespaces(args.ops.split(",")):
        block = ep.ep_moe_block(ops, mesh, s, cfg)
        step = jax.jit(ep.train_step(block))
        p, losses = placed, []
        t0 = time.perf_counter()
        for _ in range(args.steps):
            p, loss = step(p, xs, ts)
            losses.append(scalar(loss))
        first = time.perf_counter() - t0
        times = []
        for _ in range(5):
            t = time.perf_counter()
            jax.block_until_ready(step(p, xs, ts))
            times.append(time.perf_counter() - t)
        step_s = statistics.median(times)
        results[ops.name] = {"losses": losses, "step_s": step_s, "dispatch": block.dispatch}
        if lead:
            print(
                f"{ops.name:>10} ({block.dispatch}) losses: "
                + " ".join(f"{v:.6f}" for v in losses)
                + f"  step {step_s * 1e3:.2f} ms, {s.tokens / step_s:,.0f} tokens/s"
                f"  (first {args.steps} steps {first:.1f} s)"
            )
    if args.check and jax.process_count() == 1:
        want = float(moe.loss_fn(moe.jax_ops(), s)(params, x, target))
        for name, r in results.items():
            if not np.isclose(r["losses"][0], want, rtol=2e-2 if dtype == jnp.bfloat16 else 1e-5):
                raise SystemExit(f"{name}: first loss {r['losses'][0]} != unsharded {want}")
        if lead:
            print(f"unsharded block's first loss: {want:.6f} (matches)")
    return results


if __name__ == "__main__":
    main()
