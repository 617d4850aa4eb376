"""Trains the GPT-style block a few steps with `jax.nn` ops and with kerneltune's,
tunes the kerneltune model with one call, and prints the step time both ways.

    python -m examples.gpt_equinox.train --steps 5           # GPU-sized block
    python -m examples.gpt_equinox.train --steps 3 --tiny    # seconds on a CPU
"""

from __future__ import annotations

import argparse
from types import ModuleType

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import kerneltune as kt
import kerneltune.kernels
from examples import jax_ops
from examples.gpt_equinox.model import TINY, GPTBlock, GPTConfig
from examples.timing import step_time


def make_step(config: GPTConfig, ops: ModuleType, learning_rate: float = 1e-3):
    """`(step, model, opt_state)`: one jitted AdamW step on a regression loss."""
    model = GPTBlock(config, jax.random.key(0), ops=ops)
    optimizer = optax.adamw(learning_rate)

    def loss_fn(model, x, y):
        out = model(x)
        return jnp.mean(jnp.square(out.astype(jnp.float32) - y.astype(jnp.float32)))

    @eqx.filter_jit
    def step(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    return step, model, optimizer.init(eqx.filter(model, eqx.is_array))


def batch(config: GPTConfig, batch_size: int, seq: int, seed: int = 0):
    kx, ky = jax.random.split(jax.random.key(seed))
    dtype = jnp.dtype(config.dtype)
    shape = (batch_size, seq, config.dim)
    return jax.random.normal(kx, shape).astype(dtype), jax.random.normal(ky, shape).astype(dtype)


def train(config: GPTConfig, ops: ModuleType, steps: int, batch_size: int, seq: int):
    """The losses of `steps` training steps."""
    step, model, opt_state = make_step(config, ops)
    x, y = batch(config, batch_size, seq)
    losses = []
    for _ in range(steps):
        model, opt_state, loss = step(model, opt_state, x, y)
        losses.append(float(loss))
    return losses


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a tiny block (CPU, tests)")
    args = p.parse_args(argv)
    config = TINY if args.tiny else GPTConfig()
    batch_size, seq = (2, 16) if args.tiny else (8, 2048)
    times = {}
    for name, ops in (("jax.nn", jax_ops), ("kerneltune", kerneltune.kernels)):
        step, model, opt_state = make_step(config, ops)
        x, y = batch(config, batch_size, seq)
        if ops is kerneltune.kernels:
            result = kt.autotune(step, model, opt_state, x, y)  # one call tunes it all
            print(f"kerneltune tuned {len(result)} kernel calls")
        losses = []
        for _ in range(args.steps):
            model, opt_state, loss = step(model, opt_state, x, y)
            losses.append(float(loss))
        print(f"{name:10s} losses: " + " ".join(f"{v:.5f}" for v in losses))
        times[name] = step_time(step, model, opt_state, x, y)
        print(f"{name:10s} step: {times[name] * 1e3:.2f} ms")
    return times


if __name__ == "__main__":
    main()
