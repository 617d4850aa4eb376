"""A program that calls the same Mosaic GPU grouped matmul at the same shapes twice (an
MoE layer's gate and up projections, forward and backward) traces JAX's kernel once, so
JAX lowers it once (about half a second of Python a Mosaic kernel on an H200).

On a CPU, JAX's Mosaic kernels are stood in for by `jax.lax.ragged_dot` with the same
signature, counted each time it is traced; the backend runs as on a Hopper GPU."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune._src.kernel import backends as backends_module
from kerneltune.kernels.ragged_dot import api, pallas_mosaic
from kerneltune.kernels.ragged_dot.config import RaggedDotConfig
from tests.helpers import FixedChooser, close, rand

CFG = RaggedDotConfig(backend="mosaic", block_m=64, block_n=64, block_k=64)
#: Every key (the forward, d_lhs and d_rhs) runs `CFG`.
EX = kt.Executor(FixedChooser(CFG))


@pytest.fixture
def traced(monkeypatch):
    """Stands in for JAX's Mosaic kernels; returns the product ("fwd", "dlhs", "drhs")
    of each trace of them."""
    calls: list[str] = []

    @functools.cache  # one function per product, as `pallas_mosaic._load` gives
    def stand_in(product):
        def fn(a, b, *, group_sizes, block_m, block_n, block_k, max_concurrent_steps,
               grid_block_n, transpose_rhs=False):  # fmt: skip
            assert (block_m, block_n, block_k) == CFG.blocks
            calls.append("dlhs" if transpose_rhs else product)
            if product == "drhs":  # lhs[rows of g]^T . dout[rows of g]
                ends = jnp.cumsum(group_sizes)
                rows = jnp.arange(a.shape[0])
                group = jnp.searchsorted(ends, rows, side="right")
                onehot = group[None, :] == jnp.arange(group_sizes.shape[0])[:, None]
                return jnp.einsum("gm,mk,mn->gkn", onehot.astype(jnp.float32),
                                  a.astype(jnp.float32), b.astype(jnp.float32)).astype(a.dtype)  # fmt: skip
            rhs = jnp.swapaxes(b, 1, 2) if transpose_rhs else b
            return jax.lax.ragged_dot(a, rhs, group_sizes)

        return pallas_mosaic.MosaicFunction(
            fn=fn, params=frozenset({"transpose_rhs"}) if product == "fwd" else frozenset()
        )

    monkeypatch.setattr(backends_module.devices, "device_kind", lambda: "gpu")
    monkeypatch.setattr(pallas_mosaic, "is_hopper", lambda: True)
    monkeypatch.setattr(pallas_mosaic, "unsupported", lambda product, offset=False: None)
    monkeypatch.setattr(pallas_mosaic, "_require", stand_in)
    pallas_mosaic._jitted.cache_clear()  # configs traced by other tests are traced again
    yield calls


def _layer(x, gate, up, sizes):
    g = api.ragged_dot(x, gate, sizes, executor=EX).astype(jnp.float32)
    u = api.ragged_dot(x, up, sizes, executor=EX).astype(jnp.float32)
    return jnp.sum(jax.nn.silu(g) * u)


def test_the_same_kernel_at_the_same_shapes_is_traced_once_per_program(traced):
    x = rand((256, 64), seed=1).astype(jnp.bfloat16)
    gate = rand((4, 64, 128), seed=2).astype(jnp.bfloat16)
    up = rand((4, 64, 128), seed=3).astype(jnp.bfloat16)
    sizes = jnp.asarray([100, 0, 60, 96], jnp.int32)

    value, grads = jax.jit(jax.value_and_grad(_layer, (0, 1, 2)))(x, gate, up, sizes)
    # Two projections, each a forward, a d_lhs and a d_rhs: one trace of each kernel.
    assert sorted(traced) == ["dlhs", "drhs", "fwd"]

    def plain(x, gate, up, sizes):
        g = jax.lax.ragged_dot(x, gate, sizes).astype(jnp.float32)
        u = jax.lax.ragged_dot(x, up, sizes).astype(jnp.float32)
        return jnp.sum(jax.nn.silu(g) * u)

    want, want_grads = jax.value_and_grad(plain, (0, 1, 2))(x, gate, up, sizes)
    close(value, want, tol=2e-2)
    for got, expected in zip(grads, want_grads, strict=True):
        close(got.astype(jnp.float32), expected.astype(jnp.float32), tol=5e-2)


def test_another_shape_or_config_is_a_kernel_of_its_own(traced):
    x = rand((256, 64), seed=1).astype(jnp.bfloat16)
    w = rand((4, 64, 128), seed=2).astype(jnp.bfloat16)
    w2 = rand((4, 64, 256), seed=3).astype(jnp.bfloat16)
    sizes = jnp.asarray([100, 0, 60, 96], jnp.int32)
    other = RaggedDotConfig(backend="mosaic", block_m=128, block_n=64, block_k=64)

    def f(x, w, w2):
        return (
            api.ragged_dot(x, w, sizes, executor=EX).sum()
            + api.ragged_dot(x, w2, sizes, executor=EX).sum()
            + api.ragged_dot(x, w, sizes, executor=EX).sum()
        )

    jax.jit(f).trace(x, w, w2)
    assert traced == ["fwd", "fwd"]  # the third call is the first one again
    with pytest.raises(AssertionError):  # the stand-in checks the blocks it was given
        jax.jit(
            lambda x: api.ragged_dot(x, w, sizes, executor=kt.Executor(FixedChooser(other)))
        ).trace(x)
