"""On a GPU, JAX (0.11 and later) warns on every Pallas Triton lowering that the Triton
backend is deprecated; kerneltune lowers many while it tunes. A user's log gets that
warning at most once per process (skipped without a GPU)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kerneltune._src.core.jax_compat import TRITON_DEPRECATION

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("default")  # as a user's script sees them: every location once
    import jax, jax.numpy as jnp
    from kerneltune.kernels import MatmulConfig, NormConfig, SoftmaxConfig
    from kerneltune.kernels import layer_norm, matmul, softmax

    x = jax.random.normal(jax.random.PRNGKey(0), (256, 256), jnp.bfloat16)
    for cfg in (MatmulConfig(block_m=64, block_n=64, block_k=32), MatmulConfig()):
        matmul(x, x, cfg=cfg).block_until_ready()
    softmax(x, cfg=SoftmaxConfig(num_warps=4)).block_until_ready()
    softmax(x, cfg=SoftmaxConfig(num_warps=8)).block_until_ready()
    layer_norm(x, cfg=NormConfig(block_size=256, num_warps=4)).block_until_ready()
    """
)


def test_kerneltunes_triton_lowerings_warn_at_most_once_per_process():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count(TRITON_DEPRECATION) <= 1, done.stderr[-2000:]
