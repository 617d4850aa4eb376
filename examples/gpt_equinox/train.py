"""Trains the GPT-style block a few steps with `jax.nn` ops and with kerneltune's,
tunes the kerneltune model with one call, and prints the step time both ways.

    python -m examples.gpt_equinox.train --steps 5           # GPU-sized block
    python -m examples.gpt_equinox.train --steps 3 --tiny    # seconds on a CPU
"""

from __future__ import annotations

from types import ModuleType

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from examples import compare
from examples.gpt_equinox.model import TINY, GPTBlock, GPTConfig


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


def main(argv: list[str] | None = None) -> dict[str, float]:
    return compare.main(argv, __doc__.splitlines()[0], make_step, (GPTConfig(), TINY))


if __name__ == "__main__":
    main()
