"""The tuner benchmark's problem: a 108-candidate Pallas (Triton) matmul space (16
small candidates for `--tiny`), its heuristic, the kernel, and its inputs."""

from __future__ import annotations

import dataclasses
import itertools

SHAPES = [(4096, 4096, 2048), (8192, 1024, 4096), (1024, 1024, 8192)]
TINY_SHAPES = [(128, 128, 256), (256, 64, 128)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatmulCfg:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int


def space(tiny: bool) -> list[MatmulCfg]:
    """The 108 candidates; 16 small ones for --tiny (interpret mode compiles slowly)."""
    if tiny:
        axes = ((16, 32), (16, 32), (16,), (4, 8), (2, 3))
    else:
        axes = ((64, 128, 256), (64, 128, 256), (32, 64), (4, 8), (2, 3, 4))
    return [
        MatmulCfg(bm=bm, bn=bn, bk=bk, warps=w, stages=s)
        for bm, bn, bk, w, s in itertools.product(*axes)
    ]


def heuristic(tiny: bool) -> MatmulCfg:
    return (
        MatmulCfg(bm=16, bn=16, bk=16, warps=4, stages=2)
        if tiny
        else MatmulCfg(bm=128, bn=128, bk=64, warps=4, stages=3)
    )


# --- the kernel -------------------------------------------------------------------------


def matmul(cfg: MatmulCfg, interpret: bool = False):
    """`a @ b` as a Pallas kernel: one (bm, bn) output tile per program, a loop over K
    in steps of bk accumulating in float32."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def f(a, b):
        m, k = a.shape
        _, n = b.shape
        if m % cfg.bm or n % cfg.bn or k % cfg.bk:
            raise ValueError(f"{cfg} does not divide {(m, n, k)}")

        def kernel(a_ref, b_ref, o_ref):
            def body(i, acc):
                start = pl.multiple_of(i * cfg.bk, cfg.bk)
                x = a_ref[:, pl.ds(start, cfg.bk)]
                y = b_ref[pl.ds(start, cfg.bk), :]
                return acc + jnp.dot(x, y, preferred_element_type=jnp.float32)

            acc = jax.lax.fori_loop(0, k // cfg.bk, body, jnp.zeros((cfg.bm, cfg.bn), jnp.float32))
            o_ref[...] = acc.astype(o_ref.dtype)

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
            grid=(m // cfg.bm, n // cfg.bn),
            in_specs=[
                pl.BlockSpec((cfg.bm, k), lambda i, j: (i, 0)),
                pl.BlockSpec((k, cfg.bn), lambda i, j: (0, j)),
            ],
            out_specs=pl.BlockSpec((cfg.bm, cfg.bn), lambda i, j: (i, j)),
            compiler_params=None if interpret else _triton_params(cfg),
            interpret=interpret,
        )(a, b)

    return f


def _triton_params(cfg: MatmulCfg):
    from jax.experimental.pallas import triton as plgpu

    params = getattr(plgpu, "CompilerParams", None) or plgpu.TritonCompilerParams
    return params(num_warps=cfg.warps, num_stages=cfg.stages)


def inputs(shape, tiny: bool):
    import jax
    import jax.numpy as jnp

    m, n, k = shape
    dtype = jnp.float32 if tiny else jnp.bfloat16
    ka, kb = jax.random.split(jax.random.PRNGKey(sum(shape)))
    a = jax.random.normal(ka, (m, k), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (k, n), jnp.float32).astype(dtype)
    return jax.block_until_ready(a), jax.block_until_ready(b)
