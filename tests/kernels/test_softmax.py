"""Softmax: JAX's Pallas GPU kernel with a tuned warp count, the XLA path, gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kerneltune.kernels import SoftmaxConfig, SoftmaxInterpret, softmax
from kerneltune.kernels._common import relative_error, tolerance
from kerneltune.kernels.softmax import config as sc
from kerneltune.kernels.softmax.reference import softmax_reference
from kerneltune.kernels.softmax.shapes import TEST_SHAPES
from tests.helpers import heuristics_executor, host_rng, normal

BF16 = jnp.bfloat16


executor = heuristics_executor


def check(fn, x, dout, dtype, axis=-1):
    def both(x, dout):
        out, pullback = jax.vjp(fn, x)
        return out, pullback(dout)[0]

    out, g = jax.jit(both)(x, dout)
    r, rg = jax.jit(
        lambda x, d: (lambda o, pb: (o, pb(d)[0]))(
            *jax.vjp(lambda z: jax.nn.softmax(z, axis=axis), x)
        )
    )(x.astype(jnp.float32), dout.astype(jnp.float32))
    assert out.dtype == dtype and g.dtype == dtype
    assert relative_error(out, r) <= tolerance(dtype)
    assert relative_error(g, rg) <= 2 * tolerance(dtype)


def data(key, shape, dtype):
    rng = host_rng(key)
    return normal(rng, shape, dtype, scale=3.0), normal(rng, shape, dtype)


def test_candidates_prune_warps_a_row_cannot_use():
    kept, pruned = sc.candidates(sc.SoftmaxProblem(16, 64, np.dtype(np.float32)))
    assert [c.num_warps for c in kept] == [1, 2]
    assert all("more threads" in p.reason for p in pruned)
    kept, pruned = sc.candidates(sc.SoftmaxProblem(16, 65536, np.dtype(np.float32)))
    assert any("register spills" in p.reason for p in pruned)
    assert sc.heuristic(sc.SoftmaxProblem(1, 8, np.dtype(np.float32))) == SoftmaxConfig(num_warps=1)
    with pytest.raises(ValueError, match=r"SoftmaxConfig\.num_warps"):
        SoftmaxConfig(num_warps=6)


def test_the_heuristic_warps_grow_with_the_row_and_stay_in_the_candidate_space():
    # It was JAX's 4 warps at every width: 16-25% behind 1 warp at 1024 elements on an
    # H100 and an H200 (the shipped tables' timings, 2026-12-06).
    def warps(n):
        return sc.heuristic(sc.SoftmaxProblem(4096, n, np.dtype(np.float32))).num_warps

    assert [warps(n) for n in (1000, 1024, 2048, 3000, 4096, 8192, 16384, 32768)] == [
        1, 1, 1, 4, 4, 8, 8, 16,
    ]  # fmt: skip
    for n in (64, 1024, 2048, 4096, 16384, 131072, 262144):
        kept, _ = sc.candidates(sc.SoftmaxProblem(4096, n, np.dtype(np.float32)))
        assert sc.heuristic(sc.SoftmaxProblem(4096, n, np.dtype(np.float32))) in kept, n


@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", TEST_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_xla_path(key, shape, dtype):
    x, do = data(key, shape, dtype)
    ex = executor()
    check(lambda z: softmax(z, executor=ex), x, do, dtype)


def test_other_axes_are_moved_to_the_end(key):
    x, do = data(key, (6, 5, 7), jnp.float32)
    ex = executor()
    check(lambda z: softmax(z, axis=1, executor=ex), x, do, jnp.float32, axis=1)


@pytest.mark.parametrize(("shape", "dtype"), [((4, 8, 128), jnp.float32), ((7, 100), BF16)])
def test_pallas(key, shape, dtype):
    x, do = data(key, shape, dtype)
    ex = executor()
    kernel = SoftmaxInterpret(executor=ex)
    check(lambda z: ex(kernel, z, cfg=SoftmaxConfig(num_warps=2)), x, do, dtype)


def test_reference_is_a_softmax(key):
    x, _ = data(key, (3, 9), jnp.float32)
    assert np.allclose(np.asarray(softmax_reference(x)).sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("platform", ["xla", "triton"])
def test_forward_mode_and_both_modes_second_order_match_jax_nn(key, platform):
    # Before: the tuned path's gradient was a custom VJP only, so `jax.jvp`,
    # `jax.jacfwd` and `check_grads` (forward and reverse, as JAX's own softmax test
    # runs it) raised "can't apply forward-mode autodiff (jvp) to a custom_vjp function".
    from jax.test_util import check_grads

    from kerneltune._src.core import options

    x, t = data(key, (3, 16), jnp.float32)

    def ours(x):
        return softmax(x, executor=executor())

    with options.scoped(platform=platform):  # "triton": the Pallas kernel, interpreted
        out, tangent = jax.jvp(ours, (x,), (t,))
        jac = jax.jacfwd(ours)(x[0])
        # Finite differences of second order are noise in float32 (jax.nn.softmax itself
        # fails this check for about one draw in five at scale 3), so check in float64.
        with jax.enable_x64():
            x64 = jnp.asarray(np.asarray(x), jnp.float64)
            assert ours(x64).dtype == jnp.float64
            check_grads(ours, (x64,), order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)
    want, want_tangent = jax.jvp(jax.nn.softmax, (x,), (t,))
    assert relative_error(out, want) <= tolerance(jnp.float32)
    assert relative_error(tangent, want_tangent) <= tolerance(jnp.float32)
    # The Jacobian's entries are products (s_i (d_ij - s_j)) formed in another order than
    # jax.nn's: up to 1.07e-5 apart over 150 draws.
    assert relative_error(jac, jax.jacfwd(jax.nn.softmax)(x[0])) <= 2 * tolerance(jnp.float32)
