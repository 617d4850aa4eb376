"""On a GPU: every bundled kernel's heuristic config on its GPU path, in bf16 and f32,
against its float32 reference, values and gradients, at shapes near real use; and
JAX's Mosaic GPU matmul through kerneltune on Hopper (curated configs, f16, a shape
that needs padding, a gradient). Skipped without a GPU."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune.kernels import (
    Attention,
    CrossEntropyConfig,
    GatedLinearUnit,
    GLUConfig,
    LayerNorm,
    LinearSoftmaxCrossEntropy,
    Matmul,
    RaggedDotConfig,
    RMSNorm,
    Softmax,
)
from kerneltune.kernels._common import kernel_for, relative_error, tolerance
from kerneltune.kernels.attention.reference import attention_reference
from kerneltune.kernels.cross_entropy.reference import cross_entropy_reference
from kerneltune.kernels.gated_linear_unit.reference import glu_reference
from kerneltune.kernels.matmul import mosaic_space, pallas_mosaic
from kerneltune.kernels.matmul.config import MatmulProblem
from kerneltune.kernels.normalization.reference import layer_norm_reference, rms_norm_reference
from kerneltune.kernels.softmax.reference import softmax_reference
from tests.helpers import heuristics_executor

pytestmark = pytest.mark.gpu

BF16, F32 = jnp.bfloat16, jnp.float32


def normal(seed, shape, dtype=BF16, scale=1.0):
    return (scale * jax.random.normal(jax.random.PRNGKey(seed), shape, F32)).astype(dtype)


def value_and_vjp(fn, args, dout):
    """`fn(*args)` and its vector-Jacobian product with `dout`, in one program."""

    def both(args, dout):
        out, pullback = jax.vjp(fn, *args)
        return out, pullback(dout)

    return jax.jit(both)(args, dout)


def highest_dot(x, y):
    return jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST)


def case(name, dtype):
    """(kernel class, arguments, reference, keyword arguments) of one check; made when
    the test runs, so that collecting the tests without a GPU makes no arrays."""
    if name == "matmul":
        return Matmul, (normal(1, (512, 384), dtype), normal(2, (384, 256), dtype)), highest_dot, {}
    if name == "softmax":
        return Softmax, (normal(6, (777, 1000), dtype),), softmax_reference, {}
    if name in ("layer_norm", "rms_norm"):
        x = normal(3, (1000, 1536), dtype)
        w, b = normal(4, (1536,), dtype, 0.1) + 1, normal(5, (1536,), dtype, 0.1)
        if name == "layer_norm":
            return LayerNorm, (x, w, b), layer_norm_reference, {}
        return RMSNorm, (x, w), rms_norm_reference, {}
    _, d, causal = name.split()  # "attention d64 causal"
    qkv = tuple(normal(7 + i, (2, 512, 4, int(d[1:])), dtype) for i in range(3))
    return Attention, qkv, attention_reference, {"causal": causal == "causal"}


ATTENTION = [f"attention d{d} {c}" for d in (64, 128) for c in ("causal", "full")]
CASES = [(n, "float32") for n in ("matmul", "layer_norm", "rms_norm", "softmax")] + [
    (n, "bfloat16") for n in ("matmul", "layer_norm", "rms_norm", "softmax", *ATTENTION)
]


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n} {d}" for n, d in CASES])
def test_the_heuristic_gpu_path_matches_the_reference(name, dtype):
    kind, args, reference, kw = case(name, jnp.dtype(dtype))
    ex = heuristics_executor()
    kernel = kernel_for(kind, ex)
    call = functools.partial(ex, kernel, **kw)
    dout = normal(99, jax.eval_shape(call, *args).shape, args[0].dtype)
    out, grads = value_and_vjp(call, args, dout)
    f32 = tuple(a.astype(F32) for a in args)
    ref, ref_grads = value_and_vjp(functools.partial(reference, **kw), f32, dout.astype(F32))
    tol = tolerance(args[0].dtype)
    assert relative_error(out, ref) <= tol
    assert max(relative_error(g, r) for g, r in zip(grads, ref_grads)) <= 2 * tol


def test_the_mosaic_matmul_matches_the_reference_on_hopper():
    support = pallas_mosaic.support()
    if support.reason is not None:
        pytest.skip(f"Mosaic GPU matmul: {support.reason}")
    ex = heuristics_executor()
    kernel = kernel_for(Matmul, ex)
    m, k, n = 768, 384, 1280
    curated, _ = mosaic_space.candidates(MatmulProblem(m, n, k, jnp.dtype(BF16)))
    jobs = [(c, BF16, (m, k, n)) for c in curated[::2]]
    jobs += [(curated[0], jnp.float16, (m, k, n)), (curated[0], BF16, (1000, 200, 700))]
    for cfg, dtype, (mm, kk, nn) in jobs:
        x, y = normal(1, (mm, kk), dtype), normal(2, (kk, nn), dtype)
        out = jax.jit(functools.partial(kernel.run, cfg=cfg))(x, y)
        assert out.dtype == dtype and out.shape == (mm, nn), cfg
        assert relative_error(out, highest_dot(x.astype(F32), y.astype(F32))) <= tolerance(dtype)
    x, y, dout = normal(3, (m, k)), normal(4, (k, n)), normal(5, (m, n))
    out, grads = value_and_vjp(lambda a, b: ex(kernel, a, b, cfg=curated[0]), (x, y), dout)
    ref, ref_grads = value_and_vjp(highest_dot, (x.astype(F32), y.astype(F32)), dout.astype(F32))
    errors = [relative_error(out, ref)] + [relative_error(g, r) for g, r in zip(grads, ref_grads)]
    assert max(errors) <= 2 * tolerance(BF16)


# --- the loss head and the gated linear unit (issue 29) ----------------------------------

LOSS_HEAD_CFGS = {
    "xla": CrossEntropyConfig(),
    "chunked": CrossEntropyConfig(backend="chunked", chunk_size=256),
    "chunked lse": CrossEntropyConfig(backend="chunked", chunk_size=256, lse_backend="triton"),
    # One chunk, 16-bit logits: the gradient written over them after the kernel's pass.
    "one chunk lse": CrossEntropyConfig(
        backend="chunked", chunk_size=1024, logits_dtype="input", lse_backend="triton"
    ),
    "triton": CrossEntropyConfig(backend="triton", chunk_size=256),
    "triton wide": CrossEntropyConfig(
        backend="triton", chunk_size=512, block_m=128, block_v=256, block_k=64, num_stages=3
    ),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("backend", list(LOSS_HEAD_CFGS))
def test_every_loss_head_backend_matches_the_reference_on_a_gpu(backend, dtype):
    dtype = jnp.dtype(dtype)
    m, k, v = 1000, 256, 5000  # no tile divides the rows or the vocabulary
    if backend == "triton wide" and dtype == jnp.float32:
        # Tuning never runs it (288 KiB of shared memory, spilled logits), and an
        # explicit cfg= that cannot fit fails to launch: check that it is pruned.
        from kerneltune.kernels.cross_entropy import config as ce_config

        problem = ce_config.CrossEntropyProblem(m, k, v, dtype)
        assert any(rule(LOSS_HEAD_CFGS[backend]) for rule in ce_config.rules(problem))
        return
    x, w = normal(1, (m, k), dtype), normal(2, (k, v), dtype, 0.1)
    labels = jax.random.randint(jax.random.PRNGKey(3), (m,), 0, v)
    where = jax.random.uniform(jax.random.PRNGKey(4), (m,)) > 0.2
    ex = heuristics_executor()
    kernel = kernel_for(LinearSoftmaxCrossEntropy, ex)
    cfg = LOSS_HEAD_CFGS[backend]
    for reduction in ("mean", "none"):

        def call(x, w, reduction=reduction):
            return ex(kernel, x, labels, w, where, reduction=reduction, cfg=cfg)

        def ref(x, w, reduction=reduction):
            return cross_entropy_reference(x, labels, w, where, reduction=reduction)

        dout = jnp.float32(1.0) if reduction == "mean" else normal(5, (m,), F32)
        out, grads = value_and_vjp(call, (x, w), dout)
        r, r_grads = value_and_vjp(ref, (x.astype(F32), w.astype(F32)), dout)
        tol = tolerance(dtype)
        assert relative_error(out, r) <= tol, reduction
        assert max(relative_error(g, rg) for g, rg in zip(grads, r_grads)) <= 2 * tol, reduction


def test_the_lse_kernel_equals_xlas_reduction_at_a_128k_vocabulary():
    from kerneltune.kernels.cross_entropy import lse_triton, lse_xla

    logits = normal(6, (96, 128256), BF16) * 4  # 62 blocks of 2048, then 1280 columns
    labels = jax.random.randint(jax.random.PRNGKey(7), (96,), -10, 128300)
    got = jax.jit(lse_triton.lse_and_label_logit)(logits, labels)
    want = jax.jit(lse_xla.lse_and_label_logit)(logits, labels)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "cfg",
    [
        GLUConfig(),
        GLUConfig(backend="triton"),
        GLUConfig(backend="triton", block_m=128, block_n=128, block_k=64),
    ],
    ids=["xla", "triton", "triton wide"],
)
def test_every_glu_backend_matches_the_reference_on_a_gpu(cfg, dtype):
    dtype = jnp.dtype(dtype)
    if cfg.block_m == 128 and dtype == jnp.float32:
        # Tuning never runs it (288 KiB of shared memory), and an explicit cfg= that
        # cannot fit fails to launch: check that it is pruned.
        from kerneltune.kernels.gated_linear_unit import config as glu_config

        problem = glu_config.GLUProblem(1000, 384, 640, dtype)
        assert any(rule(cfg) for rule in glu_config.rules(problem))
        return
    x, w = normal(1, (1000, 384), dtype), normal(2, (384, 2, 640), dtype, 0.05)
    ex = heuristics_executor()
    kernel = kernel_for(GatedLinearUnit, ex)

    def call(x, w):
        return ex(kernel, x, w, activation=jax.nn.silu, cfg=cfg)

    dout = normal(3, (1000, 640), dtype)
    out, grads = value_and_vjp(call, (x, w), dout)
    f32 = (x.astype(F32), w.astype(F32))
    r, r_grads = value_and_vjp(lambda a, b: glu_reference(a, b, jax.nn.silu), f32, dout.astype(F32))
    tol = tolerance(dtype)
    assert relative_error(out, r) <= tol
    assert max(relative_error(g, rg) for g, rg in zip(grads, r_grads)) <= 2 * tol


RAGGED_CFGS = {
    "heuristic": None,
    "xla": RaggedDotConfig(backend="xla"),
    "triton": RaggedDotConfig(backend="triton", block_m=64, block_n=64, block_k=32),
    "triton n-order": RaggedDotConfig(
        backend="triton", block_m=128, block_n=128, block_k=64, num_warps=8, tile_order="n"
    ),
    "mosaic": RaggedDotConfig(
        backend="mosaic", block_m=128, block_n=128, block_k=64, grid_block_n=2
    ),
    "tokamax": RaggedDotConfig(backend="tokamax"),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(RAGGED_CFGS))
def test_every_ragged_dot_backend_matches_jax_on_a_gpu(name, dtype):
    # Uneven groups, an empty one, and rows past the sum (which must be zeros); the
    # gradient runs the d_lhs and d_rhs kernels with their heuristic configs.
    from kerneltune.kernels.ragged_dot.api import RaggedDot

    dtype = jnp.dtype(dtype)
    cfg = RAGGED_CFGS[name]
    ex = heuristics_executor()
    kernel = kernel_for(RaggedDot, ex)
    lhs, rhs, sizes = _ragged_args(dtype)
    if cfg is not None:
        from kerneltune.kernels.ragged_dot import config as rd_config
        from kerneltune.kernels.ragged_dot import tokamax_backend

        if cfg.backend == "tokamax" and not tokamax_backend.installed():
            pytest.skip("tokamax is not installed")
        m, k = lhs.shape
        problem = rd_config.RaggedDotProblem("fwd", m, k, rhs.shape[2], rhs.shape[0], dtype, dtype)
        if any(rule(cfg) for rule in rd_config.rules(problem)):
            # Tuning never runs it (Mosaic in float32); an explicit cfg= would not launch.
            assert cfg.backend == "mosaic" and dtype == jnp.float32
            return

    def call(lhs, rhs):
        return ex(kernel, lhs, rhs, sizes, out_dtype=dtype.name, cfg=cfg)

    def reference(lhs, rhs):
        return jax.lax.ragged_dot(lhs, rhs, sizes, precision=jax.lax.Precision.HIGHEST)

    dout = normal(3, (lhs.shape[0], rhs.shape[2]), dtype)
    # tokamax's d_rhs kernel mixes bfloat16 and bool, which this suite's strict dtype
    # promotion refuses (JAX's default, "standard", allows it).
    promotion = "standard" if name == "tokamax" else jax.config.jax_numpy_dtype_promotion
    with jax.numpy_dtype_promotion(promotion):
        out, grads = value_and_vjp(call, (lhs, rhs), dout)
    f32 = (lhs.astype(F32), rhs.astype(F32))
    r, r_grads = value_and_vjp(reference, f32, dout.astype(F32))
    tol = tolerance(dtype)
    assert relative_error(out, r) <= tol
    assert bool((out[int(sizes.sum()) :] == 0).all())
    assert max(relative_error(g, rg) for g, rg in zip(grads, r_grads)) <= 2 * tol


def _ragged_args(dtype):
    # Sums to 1018 of 1152 rows: a multiple of 8 (JAX's Mosaic kernels tile the rows by
    # 8) and of 64 (tokamax's d_rhs kernel tiles them by 64).
    sizes = jnp.array([300, 0, 77, 512, 129], jnp.int32)
    lhs = normal(1, (1152, 256), dtype)
    rhs = normal(2, (5, 256, 384), dtype, 0.1)
    return lhs, rhs, sizes


# --- ragged_dot with group_offset (expert parallelism) --------------------------------

#: Per backend, the config each product runs with (None: the heuristic).
OFFSET_CFGS = {
    "heuristic": None,
    "xla": RaggedDotConfig(backend="xla"),
    "triton": RaggedDotConfig(backend="triton", block_m=64, block_n=64, block_k=32),
    "triton n-order": RaggedDotConfig(
        backend="triton", block_m=128, block_n=128, block_k=64, num_warps=8, tile_order="n"
    ),
    "mosaic": RaggedDotConfig(
        backend="mosaic", block_m=128, block_n=128, block_k=64, grid_block_n=2
    ),
}
#: 8 experts (1020 of 1152 rows routed, an empty one); (G_local, offset): the first,
#: middle and last experts, and one local group that is empty.
OFFSET_SIZES = (100, 0, 77, 200, 129, 300, 64, 150)
OFFSETS = ((2, 0), (3, 2), (4, 4), (1, 1))


def _offset_case(dtype, local):
    lhs = normal(11, (1152, 256), dtype)
    rhs = normal(12, (local, 256, 384), dtype, 0.1)
    dout = normal(13, (1152, 384), dtype)
    return lhs, rhs, dout, jnp.asarray(OFFSET_SIZES, jnp.int32)


def _sliced(lhs, rhs, sizes, offset, dout):
    """Value and gradients by slicing the local rows out, float32, highest precision."""
    local = rhs.shape[0]
    start = int(np.sum(np.asarray(sizes)[:offset]))
    mine = jnp.asarray(np.asarray(sizes)[offset : offset + local])
    end = start + int(mine.sum())

    def f(a, b):
        part = jax.lax.ragged_dot(a[start:end], b, mine, precision=jax.lax.Precision.HIGHEST)
        return jnp.zeros((a.shape[0], b.shape[2]), F32).at[start:end].set(part)

    f32 = (lhs.astype(F32), rhs.astype(F32))
    out, grads = value_and_vjp(f, f32, dout.astype(F32))
    return out, grads, (start, end)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("local", "offset"), OFFSETS)
@pytest.mark.parametrize("name", list(OFFSET_CFGS))
def test_every_ragged_dot_backend_with_a_group_offset_on_a_gpu(name, local, offset, dtype):
    # Each product (forward, d_lhs, d_rhs) run by its own kernel with the backend's
    # config, against slicing; rows outside the local groups must be zero.
    from kerneltune.kernels.ragged_dot import config as rd_config
    from kerneltune.kernels.ragged_dot.api import RaggedDot, RaggedDotGradLhs, RaggedDotGradRhs

    dtype = jnp.dtype(dtype)
    lhs, rhs, dout, sizes = _offset_case(dtype, local)
    want, (want_lhs, want_rhs), (start, end) = _sliced(lhs, rhs, sizes, offset, dout)
    ex = heuristics_executor()
    off = jnp.array([offset], jnp.int32)
    cfg = OFFSET_CFGS[name]
    calls = {
        "fwd": (RaggedDot, (lhs, rhs, sizes, off), {}, want),
        "dlhs": (RaggedDotGradLhs, (dout, rhs, sizes, off), {}, want_lhs),
        "drhs": (RaggedDotGradRhs, (lhs, dout, sizes, off), {"local_groups": local}, want_rhs),
    }
    tol = tolerance(dtype)
    for product, (cls, args, kwargs, ref) in calls.items():
        kernel = kernel_for(cls, ex)
        if cfg is not None:
            p_args, p_kwargs = kernel.prepare(*args, **kwargs)
            inv = kt.Invocation(op_id=kernel.op_id, args=p_args, kwargs=p_kwargs)
            problem = kernel.problem(inv)
            if any(rule(cfg) for rule in rd_config.rules(problem)):
                assert cfg.backend == "mosaic" and dtype == jnp.float32
                continue
            reason = kernel.config_unusable(inv, cfg)
            if reason is not None:  # Mosaic's d_rhs takes no offset: Triton runs it
                assert (cfg.backend, product) == ("mosaic", "drhs"), reason
                continue
        got = jax.jit(lambda *a, kernel=kernel, kwargs=kwargs: ex(kernel, *a, cfg=cfg, **kwargs))(
            *args
        )
        assert relative_error(got, ref) <= 2 * tol, (product, relative_error(got, ref))
        if product != "drhs":
            assert not bool(jnp.any(got[:start])) and not bool(jnp.any(got[end:])), product


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_public_ragged_dot_with_a_traced_group_offset_on_a_gpu(dtype):
    # One program for every offset (traced), the heuristic configs, values and gradients.
    from kerneltune.kernels import ragged_dot

    dtype = jnp.dtype(dtype)
    ex = heuristics_executor()
    lhs, rhs, dout, sizes = _offset_case(dtype, 3)

    @jax.jit
    def both(a, b, offset):
        out, pullback = jax.vjp(
            lambda a, b: ragged_dot(a, b, sizes, group_offset=offset, executor=ex), a, b
        )
        return out, pullback(dout)

    tol = tolerance(dtype)
    for offset in (0, 2, 5):
        out, grads = both(lhs, rhs, jnp.int32(offset))
        want, want_grads, _ = _sliced(lhs, rhs, sizes, offset, dout)
        assert relative_error(out, want) <= tol
        assert max(relative_error(g, w) for g, w in zip(grads, want_grads)) <= 2 * tol
    assert both._cache_size() == 1
