"""kerneltune's own Pallas Triton kernels (softmax, layer norm, RMS norm, flash
attention; written when JAX 0.12.1 removed `pallas.ops.gpu`'s) at their default
blocks, against what a user has without them: XLA's fusions, and for attention cuDNN
(`jax.nn.dot_product_attention(implementation="cudnn")`). Forward + backward of a
sum (softmax: forward), bf16, device time (median of interleaved sessions); beside it
each program's first call (lowering, compiling and one run, wall seconds; ours first, so
ours pays the process's one-time costs) and its peak device memory (arguments, outputs
and temporaries, `memory_analysis`).

    python -m benchmarks.triton_kernels_gpu

These kernels are candidates that tuning weighs against XLA, cuDNN and tokamax: the
untuned GPU defaults are XLA (rowwise ops) and cuDNN (attention), so a row below 1.0x
costs a user nothing unless tuning picks it, which it does only where it is faster.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from benchmarks import harness as h
from kerneltune._src.cli.demo_measure import first_call
from kerneltune._src.params import BwdParams, FwdParams
from kerneltune.kernels.attention.backward import every_head, sum_over_groups
from kerneltune.kernels.attention.pallas_triton import flash_backward, flash_forward
from kerneltune.kernels.normalization import config as norm_config
from kerneltune.kernels.normalization.pallas_triton import norm_backward, norm_forward
from kerneltune.kernels.normalization.reference import layer_norm_xla, rms_norm_xla
from kerneltune.kernels.softmax.config import SoftmaxConfig
from kerneltune.kernels.softmax.pallas_triton import softmax_pallas

F32 = jnp.float32

#: A row: its name, then (device seconds, first-call seconds, peak bytes) of ours and of
#: the baseline.
Row = tuple[str, tuple[float, float, int | None], tuple[float, float, int | None]]


def measure(fns: dict, sets) -> dict[str, tuple[float, float, int | None]]:
    """Each program's device time, first call (lowering to first result) and peak."""
    firsts = {name: first_call(fn, sets[0])[1] for name, fn in fns.items()}
    for name, m in firsts.items():
        if m.status != "ok":
            raise RuntimeError(f"{name}: {m.note}")
    times = h.interleaved_times({name: h.session(fn, sets) for name, fn in fns.items()})
    return {name: (times[name], firsts[name].first_call_s, firsts[name].peak_bytes) for name in fns}


def _grad_of_sum(fn):
    return jax.jit(jax.grad(lambda *a: fn(*a).astype(F32).sum(), argnums=tuple(range(2))))


def rowwise_rows(shape: tuple[int, int]) -> list[Row]:
    rows, width = shape
    cfg = norm_config.heuristic(norm_config.NormProblem(rows, width, jnp.dtype(jnp.bfloat16)))

    def make(seed):
        return h.normal(seed, shape), h.normal(100 + seed, (width,)), h.normal(200 + seed, (width,))

    sets = h.arg_sets(make)
    out = []
    softmax_ours = jax.jit(lambda x, w, b: softmax_pallas(x, cfg=SoftmaxConfig(), interpret=False))
    softmax_xla = jax.jit(lambda x, w, b: jax.nn.softmax(x.astype(F32)).astype(x.dtype))
    for name, ours, xla in (
        ("softmax fwd", softmax_ours, softmax_xla),
        ("layer_norm fwd+bwd", *_norm_pair(cfg, centred=True)),
        ("rms_norm fwd+bwd", *_norm_pair(cfg, centred=False)),
    ):
        m = measure({"ours": ours, "xla": xla}, sets)
        out.append((f"{name} {rows}x{width}", m["ours"], m["xla"]))
    return out


def _norm_pair(cfg, *, centred: bool):
    @jax.custom_vjp
    def ours(x, w, b):
        return norm_forward(x, w, b if centred else None, cfg=cfg, eps=1e-5, interpret=False)[0]

    def fwd(x, w, b):
        y, mean, rstd = norm_forward(
            x, w, b if centred else None, cfg=cfg, eps=1e-5, interpret=False
        )
        return y, (x, w, b, mean, rstd)

    def bwd(res, dy):
        x, w, b, mean, rstd = res
        dx, dw, db = norm_backward(x, w, mean, rstd, dy, centred=centred, cfg=cfg, interpret=False)
        return dx, dw, db if centred else jnp.zeros_like(b)

    ours.defvjp(fwd, bwd)

    def xla(x, w, b):
        return layer_norm_xla(x, w, b, eps=1e-5) if centred else rms_norm_xla(x, w, eps=1e-5)

    return _grad_of_sum(ours), _grad_of_sum(xla)


def attention_row(b: int, t: int, heads: int, kv_heads: int, d: int) -> Row:
    scale = d**-0.5
    fcfg = FwdParams(q_blocksize=128, kv_blocksize=64, num_warps=8, num_stages=2)
    bcfg = BwdParams(q_blocksize=32, kv_blocksize=64, num_warps=4)

    @jax.custom_vjp
    def ours(q, k, v):
        return flash_forward(q, k, v, cfg=fcfg, causal=True, sm_scale=scale, interpret=False)[0]

    def fwd(q, k, v):
        out, lse = flash_forward(q, k, v, cfg=fcfg, causal=True, sm_scale=scale, interpret=False)
        return out, (q, k, v, out, lse)

    def bwd(res, dout):
        q, k, v, out, lse = res
        dq, dk, dv = flash_backward(
            q, every_head(q, k), every_head(q, v), out, lse, dout,
            cfg=bcfg, causal=True, sm_scale=scale, interpret=False,
        )  # fmt: skip
        return dq, sum_over_groups(dk, k), sum_over_groups(dv, v)

    ours.defvjp(fwd, bwd)

    def cudnn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    def make(seed):
        return (
            h.normal(seed, (b, t, heads, d)),
            h.normal(50 + seed, (b, t, kv_heads, d)),
            h.normal(90 + seed, (b, t, kv_heads, d)),
        )

    sets = h.arg_sets(make)
    grad = {"ours": _grad_of_sum(ours), "cudnn": _grad_of_sum(cudnn)}
    m = measure(grad, sets)
    return (f"attention causal fwd+bwd B{b} T{t} {heads}/{kv_heads} d{d}", m["ours"], m["cudnn"])


def main(argv: Sequence[str] | None = None) -> list[Row]:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    if not h.on_gpu():
        # The kernels are compiled for the GPU (`interpret=False`); a CPU cannot run them.
        sys.exit(f"triton_kernels_gpu: needs a GPU (found {jax.devices()[0].platform})")
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}")
    print(
        f"{'row':52s} {'ours ms':>9s} {'baseline ms':>12s} {'x baseline':>10s}"
        f" {'first s ours/base':>18s} {'peak MiB ours/base':>19s}"
    )
    rows = rowwise_rows((8192, 4096)) + rowwise_rows((16384, 1000))
    rows.append(attention_row(2, 4096, 16, 4, 128))
    rows.append(attention_row(1, 8192, 16, 4, 64))
    for name, (ours, ours_first, ours_peak), (base, base_first, base_peak) in rows:
        print(
            f"{name:52s} {ours * 1e3:9.3f} {base * 1e3:12.3f} {base / ours:9.2f}x"
            f" {ours_first:8.2f} / {base_first:<7.2f} {_mib(ours_peak):>8s} / {_mib(base_peak):<8s}"
        )
    return rows


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f}"


if __name__ == "__main__":
    main()
