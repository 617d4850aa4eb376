"""No program kerneltune compiles embeds an array as a constant: benchmark inputs,
validation references and their gradients are arguments, never closed over.

Tuning under `jax.ensure_compile_time_eval` once folded whatever did not depend on the
inputs at trace time: on an H100, tuning attention embedded its reference's float32
score matrix (4.29 GB for a Llama block, 275 GB at T=65536) and JAX warned "A large
amount of constants were captured during lowering". Here JAX's threshold for that
warning is a few kB and any such warning fails the test."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune import kernels
from kerneltune._src.caching.cache import ConfigCache
from kerneltune._src.execution.executor import Executor
from kerneltune._src.selection.chain import AutotunePolicy, ConfigSelectorChain
from tests.helpers import rand

WARN_BYTES = 4096


@pytest.fixture
def low_constant_threshold():
    before = jax.config.jax_captured_constants_warn_bytes
    jax.config.update("jax_captured_constants_warn_bytes", WARN_BYTES)
    yield
    jax.config.update("jax_captured_constants_warn_bytes", before)


def fresh_executor():
    chain = ConfigSelectorChain(
        ConfigCache(), policy=AutotunePolicy(), tuner=kt.Tuner(progress=False)
    )
    return Executor(chain), chain


X = rand((64, 256), seed=0)
Q = rand((1, 128, 2, 32), seed=1)
CALLS = {
    "matmul": (kernels.MatmulInterpret, (X, rand((256, 64), seed=2))),
    "layer_norm": (kernels.LayerNormInterpret, (X, rand((256,), seed=3), rand((256,), seed=4))),
    "rms_norm": (kernels.RMSNormInterpret, (X, rand((256,), seed=3))),
    "softmax": (kernels.SoftmaxInterpret, (X,)),
    "attention": (kernels.AttentionInterpret, (Q, rand(Q.shape, seed=5), rand(Q.shape, seed=6))),
}


def constant_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.block_until_ready(fn())
    return [str(w.message)[:300] for w in caught if "constants were captured" in str(w.message)]


@pytest.mark.parametrize("how", ["eager", "grad under jit"])
@pytest.mark.parametrize("op", sorted(CALLS))
def test_tuning_a_bundled_op_captures_no_constants(op, how, low_constant_threshold):
    kernel_type, args = CALLS[op]
    ex, chain = fresh_executor()
    kernel = kernel_type()
    if how == "eager":
        found = constant_warnings(lambda: ex(kernel, *args))
    else:  # tuned while the user's step is traced, forward and backward

        def loss(*a):
            return jnp.sum(ex(kernel, *a).astype(jnp.float32))

        step = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
        found = constant_warnings(lambda: step(*args))
    assert not found, found
    if op != "softmax":  # the interpreter's softmax has one candidate: nothing to tune
        assert len(chain.cache) >= 1


def test_tuning_a_whole_function_captures_no_constants(low_constant_threshold):
    attention, norm = kernels.AttentionInterpret(), kernels.RMSNormInterpret()

    def loss(q, k, v):
        h = attention(q, k, v)  # through the default executor, as kt.autotune tunes it
        return jnp.sum(norm(h.reshape(-1, 32), jnp.ones(32)))

    step = jax.value_and_grad(loss, argnums=(0, 1, 2))
    q, k, v = CALLS["attention"][1]
    result = None

    def tune_then_step():
        nonlocal result
        result = kt.autotune(step, q, k, v, tuner=kt.Tuner(progress=False))
        return step(q, k, v)

    found = constant_warnings(tune_then_step)
    assert not found, found
    assert {e.op_id_v.partition("@")[0] for e in result} >= {
        "attention-interpret",
        "rms_norm-interpret",
    }
