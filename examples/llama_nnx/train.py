"""Trains a Llama-style block with its loss head a few steps with `jax.nn` ops and with
kerneltune's, tunes the kerneltune model with one call, and prints the step time both
ways.

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
from examples.llama_nnx.model import TINY, LlamaConfig, LlamaLM


def make_step(config: LlamaConfig, ops: ModuleType, learning_rate: float = 1e-3):
    """`(step, params, opt_state)`: one jitted AdamW step on a next-token loss (each
    position's label is drawn from the batch's targets `y`: their argmax over the
    features, a token id below `dim <= vocab`)."""
    model = LlamaLM(config, ops=ops, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = optax.adamw(learning_rate)

    def loss_fn(params, x, y):
        labels = jnp.argmax(y, axis=-1).astype(jnp.int32)
        return nnx.merge(graphdef, params).loss(x, labels)

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
