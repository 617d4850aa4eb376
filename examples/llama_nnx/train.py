"""Trains the Llama-style block a few steps with `jax.nn` ops and with kerneltune's,
tunes the kerneltune model with one call, and prints the step time both ways.

    python -m examples.llama_nnx.train --steps 5           # GPU-sized block
    python -m examples.llama_nnx.train --steps 3 --tiny    # seconds on a CPU
"""

from __future__ import annotations

import argparse
from types import ModuleType

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import kerneltune as kt
import kerneltune.kernels
from examples import jax_ops
from examples.llama_nnx.model import TINY, LlamaBlock, LlamaConfig
from examples.timing import step_time


def make_step(config: LlamaConfig, ops: ModuleType, learning_rate: float = 1e-3):
    """`(step, params, opt_state)`: one jitted AdamW step on a next-token-like loss."""
    model = LlamaBlock(config, ops=ops, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = optax.adamw(learning_rate)

    def loss_fn(params, x, y):
        out = nnx.merge(graphdef, params)(x)
        return jnp.mean(jnp.square(out.astype(jnp.float32) - y.astype(jnp.float32)))

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, params, optimizer.init(params)


def batch(config: LlamaConfig, batch_size: int, seq: int, seed: int = 0):
    kx, ky = jax.random.split(jax.random.key(seed))
    dtype = jnp.dtype(config.dtype)
    shape = (batch_size, seq, config.dim)
    return jax.random.normal(kx, shape).astype(dtype), jax.random.normal(ky, shape).astype(dtype)


def train(config: LlamaConfig, ops: ModuleType, steps: int, batch_size: int, seq: int):
    """The losses of `steps` training steps."""
    step, params, opt_state = make_step(config, ops)
    x, y = batch(config, batch_size, seq)
    losses = []
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss))
    return losses


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a tiny block (CPU, tests)")
    args = p.parse_args(argv)
    config = TINY if args.tiny else LlamaConfig()
    batch_size, seq = (2, 16) if args.tiny else (8, 2048)
    times = {}
    for name, ops in (("jax.nn", jax_ops), ("kerneltune", kerneltune.kernels)):
        step, params, opt_state = make_step(config, ops)
        x, y = batch(config, batch_size, seq)
        if ops is kerneltune.kernels:
            result = kt.autotune(step, params, opt_state, x, y)  # one call tunes it all
            print(f"kerneltune tuned {len(result)} kernel calls")
        losses = []
        for _ in range(args.steps):
            params, opt_state, loss = step(params, opt_state, x, y)
            losses.append(float(loss))
        print(f"{name:10s} losses: " + " ".join(f"{v:.5f}" for v in losses))
        times[name] = step_time(step, params, opt_state, x, y)
        print(f"{name:10s} step: {times[name] * 1e3:.2f} ms")
    return times


if __name__ == "__main__":
    main()
