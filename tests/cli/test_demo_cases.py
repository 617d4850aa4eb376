"""The demo's rows compare like with like: every implementation of a row computes what
plain JAX computes; the MoE layer is the example's; the interpreting executor runs the
Pallas kernels in the interpreter and leaves the others alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune import kernels as ktk
from kerneltune._src.cli import demo_cases, demo_executors, demo_moe
from tests.helpers import rand


def _close(a, b, rtol=2e-4, atol=2e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), rtol, atol)


@pytest.mark.parametrize("case", demo_cases.cases(on_gpu=False), ids=lambda c: c.name)
def test_kerneltune_untuned_computes_what_plain_jax_computes(case):
    """Through the interpreted Pallas kernels, values and gradients alike: the rows time
    one computation, not two."""
    args = case.args(0)
    ex = demo_executors.untuned(interpret=True)
    want = jax.jit(case.plain)(*args)
    got = jax.jit(case.kerneltune(ex))(*args)
    _close(got, want)


def test_the_moe_layer_is_the_examples_block():
    from examples.moe import model

    s = demo_moe.MoEShape(32, 16, 24, 4, 2)
    example = model.MoEShape("tiny", s.tokens, s.d, s.f, s.experts, s.top_k)
    params = demo_moe.init_params(s, jnp.float32, seed=3)
    x, target = demo_moe.inputs(s, jnp.float32, seed=4)
    ours = jax.jit(demo_moe.train_step(jax.lax.ragged_dot, s))(params, x, target)
    theirs = jax.jit(model.train_step(model.jax_ops(), example))(params, x, target)
    _close(ours, theirs, rtol=1e-6, atol=1e-7)
    assert float(ours[1]) > 0


def test_the_interpreting_executor_runs_pallas_kernels_interpreted_only():
    seen: list[str] = []
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(allow_autotune=False, cache_miss_fallback="heuristics"),
        on_event=lambda event, **data: seen.append(data["op_id"]),
    )
    ex = demo_executors.InterpretingExecutor(chain)
    x = rand((8, 128), seed=0)
    np.testing.assert_allclose(ktk.softmax(x, executor=ex), jax.nn.softmax(x), rtol=1e-6)
    q = rand((1, 32, 2, 16), seed=1)
    ktk.attention(q, q, q, is_causal=True, local_window_size=(8, 0), executor=ex)
    # Under jit (the flattened N-D call goes through `call_traced`) too.
    jax.jit(lambda a: ktk.layer_norm(a, executor=ex))(x.reshape(2, 4, 128))
    # The attention variants have an interpretable backend too (kerneltune's Mosaic GPU
    # kernel), so they run as their interpreted twin.
    assert seen == [
        "softmax-interpret@v1",
        "attention_variants-interpret@v1",
        "layer_norm-interpret@v1",
    ]


def test_the_gpu_rows_are_benchmarks_md_shapes():
    """The GPU sizes are those the sample quotes (a GPU run reads against them)."""
    from kerneltune._src.cli import demo_sample

    gpu = [c.shape for c in _gpu_cases()]
    for row, shape in zip(demo_sample.ROWS, gpu, strict=True):
        assert shape.startswith(row[1]), (row[1], shape)


def _gpu_cases():
    """The GPU rows' descriptions (nothing is allocated: `args` is not called)."""
    return demo_cases.cases(on_gpu=True)
