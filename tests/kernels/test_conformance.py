"""One conformance suite for every bundled kernel: eagerly, under jit, under grad, under
vmap and under shard_map, its values and gradients match the op's reference
implementation (`Kernel.reference`). The `...Interpret` kernels run the Pallas code in
the Pallas interpreter; the plain kernels run their platform's path (XLA on a CPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import kerneltune as kt
from kerneltune import kernels
from kerneltune.kernels._common import relative_error, tolerance


@dataclasses.dataclass(frozen=True)
class Case:
    kernel: type
    make_args: Callable[[jax.Array], tuple[Any, ...]]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def normal(key, shape):
    return jax.random.normal(key, shape, jnp.float32)


def split(key, n):
    return jax.random.split(key, n)


def _mm(key):
    a, b = split(key, 2)
    return normal(a, (32, 32)), normal(b, (32, 32))


def _ln(key):
    a, b, c = split(key, 3)
    return normal(a, (8, 128)), 1.0 + 0.1 * normal(b, (128,)), 0.1 * normal(c, (128,))


def _rms(key):
    a, b = split(key, 2)
    return normal(a, (8, 128)), 1.0 + 0.1 * normal(b, (128,))


def _sm(key):
    return (normal(key, (8, 128)),)


def _att(key):
    a, b, c = split(key, 3)
    return normal(a, (1, 32, 2, 16)), normal(b, (1, 32, 2, 16)), normal(c, (1, 32, 2, 16))


CASES = {
    "matmul": Case(kernels.Matmul, _mm),
    "matmul-interpret": Case(kernels.MatmulInterpret, _mm),
    "layer_norm": Case(kernels.LayerNorm, _ln),
    "layer_norm-interpret": Case(kernels.LayerNormInterpret, _ln),
    "rms_norm": Case(kernels.RMSNorm, _rms),
    "rms_norm-interpret": Case(kernels.RMSNormInterpret, _rms),
    "softmax": Case(kernels.Softmax, _sm),
    "softmax-interpret": Case(kernels.SoftmaxInterpret, _sm),
    "attention": Case(kernels.Attention, _att, {"causal": True}),
    "attention-interpret": Case(kernels.AttentionInterpret, _att, {"causal": True}),
}

#: Interpreted Pallas and XLA in float32 against the reference's float32; on a GPU the
#: plain kernels run their GPU code, whose float32 matrix products use TF32.
TOLERANCE = max(2e-4, tolerance(jnp.float32))


def heuristics():
    return kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )


def setup(name):
    case = CASES[name]
    ex = heuristics()
    kernel = case.kernel(executor=ex)
    args = case.make_args(jax.random.PRNGKey(len(name)))
    p_args, p_kwargs = kernel.prepare(*args, **case.kwargs)

    def ours(*a):
        return ex(kernel, *a, **case.kwargs)

    def reference(*a):
        prepared, kw = kernel.prepare(*a, **case.kwargs)
        return kernel.reference(*prepared, **kw)

    return ex, kernel, args, ours, reference


@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_and_jit_values_match_the_reference(name):
    _, _, args, ours, reference = setup(name)
    want = reference(*args)
    assert relative_error(ours(*args), want) <= TOLERANCE
    assert relative_error(jax.jit(ours)(*args), want) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_the_reference(name):
    _, _, args, ours, reference = setup(name)
    cot = normal(jax.random.PRNGKey(7), jax.eval_shape(reference, *args).shape)

    def grads(fn):
        return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * cot), argnums=range(len(args))))(*args)

    for mine, theirs in zip(grads(ours), grads(reference), strict=True):
        assert relative_error(mine, theirs) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_over_a_leading_axis_matches_the_reference(name):
    _, _, args, ours, reference = setup(name)
    batched = jnp.stack([args[0], 0.5 * args[0]])
    in_axes = (0,) + (None,) * (len(args) - 1)
    want = jax.vmap(reference, in_axes=in_axes)(batched, *args[1:])
    assert relative_error(jax.vmap(ours, in_axes=in_axes)(batched, *args[1:]), want) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_shard_map_on_a_one_device_mesh_matches_the_reference(name):
    ex, kernel, args, _, reference = setup(name)
    mesh = jax.make_mesh((1,), ("x",))
    specs = tuple(P() for _ in args)
    out = ex(
        kernel, *args, method="shard_map", mesh=mesh, in_specs=specs, out_specs=P(),
        **CASES[name].kwargs,
    )  # fmt: skip
    assert relative_error(out, reference(*args)) <= TOLERANCE
