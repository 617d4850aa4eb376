"""Trains the Llama-style block a few steps with `jax.nn` ops and with kerneltune's,
tunes the kerneltune model with one call, and prints the step time both ways.

    python -m examples.llama_nnx.train --steps 5           # GPU-sized block
    python -m examples.llama_nnx.train --steps 3 --tiny    # seconds on a CPU
"""

from __future__ import annotations

from types import ModuleType

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from examples import compare
from examples.llama_nnx.model import TINY, LlamaBlock, LlamaConfig


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


def main(argv: list[str] | None = None) -> dict[str, float]:
    return compare.main(argv, __doc__.splitlines()[0], make_step, (LlamaConfig(), TINY))


if __name__ == "__main__":
    main()
