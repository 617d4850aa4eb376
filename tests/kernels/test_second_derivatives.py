"""Second derivatives through kernels with a custom VJP (issue 11).

A bundled kernel's Pallas path (here in the Pallas interpreter) cannot be
differentiated by JAX; its second derivatives are taken from the op's reference math
and must equal JAX's. A user kernel written in plain JAX keeps being differentiated
through its own code; one that JAX cannot differentiate gets one clear error.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune.kernels.attention import AttentionInterpret
from kerneltune.kernels.matmul import MatmulInterpret
from kerneltune.kernels.normalization import LayerNormInterpret, RMSNormInterpret
from kerneltune.kernels.softmax import SoftmaxInterpret
from tests.helpers import close, heuristics_executor, rand

EX = heuristics_executor()
#: The tolerance of every `close` here.
TOL = 2e-4


def grad_of_grad(fn, *args):
    """d/dargs of sum(w · d/dx0 loss): a reverse-over-reverse second derivative."""
    w = rand(args[0].shape, seed=99)

    def inner(*a):
        return (jax.grad(lambda *b: (fn(*b) ** 2).sum())(*a) * w).sum()

    # One program: op by op, each primitive of the two backward passes would compile on
    # its own (the derivatives are the same).
    return jax.jit(jax.grad(inner, argnums=tuple(range(len(args)))))(*args)


def attention_ref(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=0.25)


def layer_norm_ref(x, w, b):
    xf = x - x.mean(-1, keepdims=True)
    return xf * jax.lax.rsqrt((xf * xf).mean(-1, keepdims=True) + 1e-6) * w + b


def rms_norm_ref(x, w):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


CASES = {
    "attention": (
        lambda q, k, v: EX(AttentionInterpret(executor=EX), q, k, v, causal=True, sm_scale=0.25),
        attention_ref,
        lambda: (
            rand((1, 16, 2, 16), seed=0),
            rand((1, 16, 2, 16), seed=1),
            rand((1, 16, 2, 16), seed=2),
        ),
    ),
    "layer_norm": (
        lambda x, w, b: EX(LayerNormInterpret(), x, w, b, eps=1e-6),
        layer_norm_ref,
        lambda: (rand((6, 32), seed=0), 1 + rand((32,), seed=1), rand((32,), seed=2)),
    ),
    "rms_norm": (
        lambda x, w: EX(RMSNormInterpret(), x, w, eps=1e-6),
        rms_norm_ref,
        lambda: (rand((6, 32), seed=0), 1 + rand((32,), seed=1)),
    ),
    "softmax": (
        lambda x: EX(SoftmaxInterpret(), x),
        lambda x: jax.nn.softmax(x, axis=-1),
        lambda: (rand((6, 32), seed=0),),
    ),
    "matmul": (
        lambda x, y: EX(MatmulInterpret(executor=EX), x, y),
        lambda x, y: x @ y,
        lambda: (rand((16, 32), seed=0), rand((32, 16), seed=1)),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_grad_of_grad_through_the_pallas_interpreter_matches_jax(name):
    ours, ref, make = CASES[name]
    args = make()
    close(ours(*args), ref(*args), tol=TOL)
    for got, want in zip(grad_of_grad(ours, *args), grad_of_grad(ref, *args), strict=True):
        close(got, want, tol=TOL)


def test_hessian_through_the_pallas_interpreter_matches_jax():
    ours, ref, make = CASES["layer_norm"]
    x, w, b = make()
    x = x[:2, :8]
    w, b = w[:8], b[:8]
    h = jax.jit(jax.hessian(lambda x: (ours(x, w, b) ** 3).sum()))(x)
    close(h, jax.jit(jax.hessian(lambda x: (ref(x, w, b) ** 3).sum()))(x), tol=TOL)


@dataclasses.dataclass(frozen=True)
class Cfg:
    block: int = 1


class PlainJaxCube(kt.Kernel):
    """A kernel written in plain JAX with a hand-written backward: JAX differentiates
    its own code twice."""

    op_id = "test_plain_jax_cube"

    def run(self, x, *, cfg):
        return x**3

    def heuristic_cfg(self, inv):
        return Cfg()

    def fwd_with_residuals(self, x, *, cfg):
        return x**3, x * x

    def vjp(self, x2, out, dout, x, *, cfg):
        return (3 * x2 * dout,)


class CallbackCube(PlainJaxCube):
    """The same op computed through a host callback, which JAX cannot differentiate
    (as it cannot a Pallas or Triton call)."""

    op_id = "test_callback_cube"

    def fwd_with_residuals(self, x, *, cfg):
        spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.pure_callback(lambda a: np.asarray(a) ** 3, spec, x), x * x


def test_a_plain_jax_kernel_is_still_differentiated_through_its_own_code():
    x = rand((5,), seed=0)
    got = jax.grad(lambda x: jax.grad(lambda x: EX(PlainJaxCube(), x).sum())(x).sum())(x)
    close(got, 6 * x, tol=TOL)


def test_a_kernel_jax_cannot_differentiate_twice_gets_one_clear_error():
    x = rand((5,), seed=0)
    close(
        jax.grad(lambda x: EX(CallbackCube(), x).sum())(x), 3 * x * x, tol=TOL
    )  # first order works
    with pytest.raises(TypeError, match=r"'test_callback_cube': second derivatives .* "
                       r"Define `reference\(self"):  # fmt: skip
        jax.grad(lambda x: jax.grad(lambda x: EX(CallbackCube(), x).sum())(x).sum())(x)


def test_a_user_reference_gives_second_derivatives_to_an_opaque_kernel():
    class WithReference(CallbackCube):
        op_id = "test_callback_cube_with_reference"

        def reference(self, x):
            return x**3

    x = rand((5,), seed=0)
    got = jax.grad(lambda x: jax.grad(lambda x: EX(WithReference(), x).sum())(x).sum())(x)
    close(got, 6 * x, tol=TOL)
    close(jax.jit(jax.hessian(lambda x: EX(WithReference(), x).sum()))(x), jnp.diag(6 * x), tol=TOL)
