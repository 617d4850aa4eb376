"""Tuned vs heuristic vs ceiling for every bundled kernel, on a GPU.

    PYTHONPATH=. python benchmarks/kernels_gpu.py [--quick] [--json OUT.json]

For each kernel and shape it prints: the heuristic config's time (JAX's defaults for
JAX's own kernels), the tuned config's time, the speedup, the tuned time as a
percentage of the relevant ceiling, and the tuning wall time:

- matmul: `jnp.dot` (cuBLAS) on the same inputs: % = t(jnp.dot) / t(tuned). On a
  Hopper GPU its candidates span two backends, our Pallas/Triton kernel and JAX's
  Mosaic GPU Hopper matmul; the note gives each backend's best time;
- attention: `jax.nn.dot_product_attention(implementation="cudnn")` forward, and its
  backward (its forward+backward minus its forward): % = t(cuDNN) / t(tuned);
- layer norm, RMS norm, softmax: memory bandwidth: bytes read and written once over
  the tuned time, as a % of a device-to-device copy's measured bandwidth.

Every time is the median of device-timer samples (CUPTI where available) taken by
kerneltune's Tuner; heuristic and tuned times come from the same tuning session
(interleaved rounds) and are re-measured once more side by side afterwards. Before
timing, every kernel's output (and gradient, where it has one) is checked against
its XLA reference on fresh random inputs; `--only mosaic` checks the Mosaic matmul
(several configs, both 16-bit dtypes, a padded shape, a gradient) and `--only sweep`
times a wider set of Mosaic configs at 4096³ than the tuner's curated one.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kerneltune import ConfigCache, ConfigSelectorChain, Executor, Tuner
from kerneltune.kernels import (
    Attention,
    LayerNorm,
    Matmul,
    RMSNorm,
    Softmax,
)
from kerneltune.kernels._common import kernel_for, relative_error, tolerance
from kerneltune.kernels.attention import shapes as attention_shapes
from kerneltune.kernels.attention.reference import attention_reference
from kerneltune.kernels.matmul import mosaic_space, pallas_mosaic
from kerneltune.kernels.matmul import shapes as matmul_shapes
from kerneltune.kernels.matmul.config import MatmulConfig, MatmulProblem
from kerneltune.kernels.normalization import shapes as norm_shapes
from kerneltune.kernels.normalization.reference import (
    layer_norm_reference,
    rms_norm_reference,
)
from kerneltune.kernels.softmax import shapes as softmax_shapes
from kerneltune.kernels.softmax.reference import softmax_reference

BF16 = jnp.bfloat16


@dataclasses.dataclass
class Result:
    kernel: str
    shape: str
    heuristic_s: float | None = None
    tuned_s: float | None = None
    recheck_heuristic_s: float | None = None
    recheck_tuned_s: float | None = None
    ceiling_s: float | None = None
    ceiling_note: str = ""
    pct_of_ceiling: float | None = None
    tuning_s: float | None = None
    candidates: int = 0
    failed: int = 0
    winner: str = ""
    timer: str = ""
    error: str = ""
    heuristic_cfg: Any = None
    best_cfg: Any = None
    backend_best_s: dict[str, float] = dataclasses.field(default_factory=dict)


def normal(
    key: jax.Array, shape: tuple[int, ...], dtype: Any = BF16, scale: float = 1.0
) -> jax.Array:
    return (scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


class Bench:
    def __init__(self, quick: bool, budget_s: float, smoke: bool = False) -> None:
        self.quick = quick
        self.smoke = smoke
        self.deadline = time.perf_counter() + budget_s
        self.tuner = Tuner(progress=False, time_budget_s=45.0, compile_timeout_s=60.0)
        self.timer = Tuner(iters=10, progress=False)
        self.results: list[Result] = []
        self.checks: list[str] = []

    def executor(self, events: list[tuple[str, dict[str, Any]]]) -> Executor:
        chain = ConfigSelectorChain(
            ConfigCache(),
            tuner=self.tuner,
            persistent=None,
            on_event=lambda e, **d: events.append((e, d)),
        )
        return Executor(chain)

    def time(self, fn: Callable[..., Any], *args: Any) -> float:
        return self.timer.measure(fn, *args)

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline

    # -- one tuned call -------------------------------------------------------------

    def tune(
        self,
        name: str,
        shape: str,
        call: Callable[[Executor], Any],
        ceiling: Callable[[], float] | None,
        ceiling_note: str,
        bytes_moved: int | None = None,
        bandwidth: float | None = None,
        rerun: Callable[[Executor, Any], Callable[..., Any]] | None = None,
    ) -> list[Result]:
        if self.out_of_time():
            r = Result(name, shape, error="skipped: out of time budget")
            self.results.append(r)
            return [r]
        events: list[tuple[str, dict[str, Any]]] = []
        ex = self.executor(events)
        warm_gpu(self)
        try:
            t0 = time.perf_counter()
            jax.block_until_ready(call(ex))
            wall = time.perf_counter() - t0
        except Exception as e:
            r = Result(name, shape, error=f"{type(e).__name__}: {str(e)[:300]}")
            traceback.print_exc()
            self.results.append(r)
            return [r]
        out = []
        for event, data in events:
            if event != "autotune_finish":
                continue
            rep = data["report"]
            op = data["op_id"].split("@")[0]
            r = Result(
                kernel=op,
                shape=shape,
                heuristic_s=rep.heuristic_time_s,
                tuned_s=rep.best_time_s,
                tuning_s=rep.wall_s,
                candidates=rep.num_evaluated,
                failed=len([c for c in rep.failures if c.status != "pruned"]),
                winner=_cfg_text(rep.best),
                timer=rep.timer,
                heuristic_cfg=rep.heuristic_cfg,
                best_cfg=rep.best,
                backend_best_s=_best_per_backend(rep),
            )
            out.append(r)
        if not out:
            out.append(
                Result(
                    name,
                    shape,
                    error=f"nothing was tuned ({[e for e, _ in events]}); wall {wall:.1f}s",
                )
            )
        try:
            if ceiling is not None and out[0].tuned_s:
                c = ceiling()
                out[0].ceiling_s = c
                out[0].ceiling_note = ceiling_note
                out[0].pct_of_ceiling = 100.0 * c / out[0].tuned_s
            if bytes_moved and bandwidth and out[0].tuned_s:
                out[0].ceiling_note = ceiling_note
                out[0].pct_of_ceiling = 100.0 * (bytes_moved / out[0].tuned_s) / bandwidth
        except Exception as e:
            out[0].ceiling_note = f"ceiling failed: {type(e).__name__}: {str(e)[:120]}"
        self.results += out
        return out


def _best_per_backend(rep: Any) -> dict[str, float]:
    """The fastest validated time of each config backend among the candidates (only
    for configs with a `backend` field, i.e. the matmul)."""
    best: dict[str, float] = {}
    for c in rep.candidates:
        backend = getattr(c.cfg, "backend", None)
        if backend is not None and c.ok:
            best[backend] = min(best.get(backend, math.inf), c.time_s)
    return best


def _cfg_text(cfg: Any) -> str:
    if cfg is None:
        return "-"
    if dataclasses.is_dataclass(cfg):
        short = {
            "q_blocksize": "bq",
            "kv_blocksize": "bkv",
            "num_warps": "w",
            "num_stages": "s",
            "block_size": "block",
            "group_m": "g",
            "max_concurrent_steps": "steps",
            "wg_dimension": "wg",
            "cluster_dimension": "cluster",
            "grid_minor_dim": "minor",
            "grid_tile_width": "gw",
            "epi_tile_m": "epi_m",
            "epi_tile_n": "epi_n",
        }
        text = " ".join(
            f"{short.get(f.name, f.name)}={getattr(cfg, f.name)}"
            for f in dataclasses.fields(cfg)
            if getattr(cfg, f.name) is not None and f.name != "backend"
        )
        backend = getattr(cfg, "backend", None)
        return text if backend in (None, "triton") else f"[{backend}] {text}"
    return str(cfg)


# --- correctness -------------------------------------------------------------------


def _value_and_grads(
    fn: Callable[..., Any], args: tuple[Any, ...], dout: jax.Array
) -> tuple[Any, Any]:
    """`fn(*args)` and its vector-Jacobian product with `dout`, in one jitted program."""

    def both(args: tuple[Any, ...], dout: jax.Array) -> tuple[Any, Any]:
        out, pullback = jax.vjp(fn, *args)
        return out, pullback(dout)

    return jax.jit(both)(args, dout)


def check_all(b: Bench) -> None:
    """Every kernel's Pallas path (heuristic config) against its float32 reference,
    values and gradients, on fresh random inputs."""
    from kerneltune import AutotunePolicy

    ex = Executor(
        ConfigSelectorChain(ConfigCache(), policy=AutotunePolicy(cache_miss_fallback="heuristics"))
    )
    key = iter(jax.random.split(jax.random.PRNGKey(int(time.time())), 64))
    big = not b.smoke

    def check(
        name: str, kernel: Any, args: tuple[Any, ...], reference: Callable[..., Any], **kw: Any
    ) -> None:
        dtype = args[0].dtype
        dout = normal(
            next(key), jax.eval_shape(lambda *a: ex(kernel, *a, **kw), *args).shape, dtype
        )
        out, grads = _value_and_grads(lambda *a: ex(kernel, *a, **kw), args, dout)
        f32 = tuple(a.astype(jnp.float32) for a in args)
        ref, ref_grads = _value_and_grads(
            lambda *a: reference(*a, **kw), f32, dout.astype(jnp.float32)
        )
        tol = tolerance(dtype)
        for what, err, bound in (
            ("", relative_error(out, ref), tol),
            (" grad", max(relative_error(g, r) for g, r in zip(grads, ref_grads)), 2 * tol),
        ):
            ok = err <= bound and math.isfinite(err)
            b.checks.append(
                f"{'ok  ' if ok else 'FAIL'} {name}{what}: rel err {err:.2e} (tol {bound:.0e})"
            )

    def mm_ref(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST)

    for dtype in (BF16, jnp.float32):
        dn = jnp.dtype(dtype).name
        m, k, n = (512, 384, 256) if big else (64, 32, 64)
        check(
            f"matmul {dn}",
            kernel_for(Matmul, ex),
            (normal(next(key), (m, k), dtype), normal(next(key), (k, n), dtype)),
            mm_ref,
        )
        rows, n = (1000, 1536) if big else (8, 200)
        x = normal(next(key), (rows, n), dtype)
        w, bias = normal(next(key), (n,), dtype, 0.1) + 1, normal(next(key), (n,), dtype, 0.1)
        check(f"layer_norm {dn}", kernel_for(LayerNorm, ex), (x, w, bias), layer_norm_reference)
        check(f"rms_norm {dn}", kernel_for(RMSNorm, ex), (x, w), rms_norm_reference)
        check(
            f"softmax {dn}",
            kernel_for(Softmax, ex),
            (normal(next(key), (777, 1000) if big else (7, 100), dtype),),
            softmax_reference,
        )
    for causal in (False, True):
        for d in (64, 128) if big else (16,):
            shape = (2, 512, 4, d) if big else (1, 64, 2, d)
            qkv = tuple(normal(next(key), shape) for _ in range(3))
            check(
                f"attention d={d} causal={causal}",
                kernel_for(Attention, ex),
                qkv,
                attention_reference,
                causal=causal,
            )


def check_mosaic(b: Bench) -> None:
    """JAX's Mosaic GPU Hopper matmul through kerneltune, against a float32 reference
    on fresh random inputs: several curated configs in bf16, one in f16, one on a
    shape that needs padding, and one gradient (Mosaic forward; the backward's
    transposed products run the heuristic). Each failure is reported, not raised."""
    support = pallas_mosaic.support()
    module = pallas_mosaic._load()
    print(f"mosaic: {pallas_mosaic.MODULE}: {support.reason or 'usable'}", flush=True)
    if module.fn is not None:
        import inspect

        print(
            f"mosaic: matmul{inspect.signature(module.fn)}; TuningConfig fields "
            f"{sorted(support.fields)}",
            flush=True,
        )
    if support.reason is not None:
        b.checks.append(f"SKIP mosaic: {support.reason}")
        return
    from kerneltune import AutotunePolicy

    ex = Executor(
        ConfigSelectorChain(ConfigCache(), policy=AutotunePolicy(cache_miss_fallback="heuristics"))
    )
    kernel = kernel_for(Matmul, ex)
    key = iter(jax.random.split(jax.random.PRNGKey(int(time.time())), 64))
    m, k, n = (768, 384, 1280) if not b.smoke else (256, 128, 256)
    p = MatmulProblem(m, n, k, jnp.dtype(BF16))
    curated, _ = mosaic_space.candidates(p)
    jobs: list[tuple[MatmulConfig, Any, tuple[int, int, int]]] = [
        (c, BF16, (m, k, n)) for c in curated[::2]
    ]
    jobs.append((curated[0], jnp.float16, (m, k, n)))
    jobs.append((curated[0], BF16, (1000, 200, 700)))  # padded to the cluster tile and bk

    def mm_ref(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.dot(
            x.astype(jnp.float32), y.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
        )

    for cfg, dtype, (mm, kk, nn) in jobs:
        name = f"mosaic {jnp.dtype(dtype).name} {mm}x{kk}x{nn} {_cfg_text(cfg)}"
        t0 = time.perf_counter()
        try:
            x, y = normal(next(key), (mm, kk), dtype), normal(next(key), (kk, nn), dtype)
            out = jax.jit(functools.partial(kernel.run_triton, cfg=cfg))(x, y)
            err = relative_error(out, mm_ref(x, y))
            ok = err <= tolerance(dtype) and out.dtype == dtype and out.shape == (mm, nn)
            b.checks.append(
                f"{'ok  ' if ok else 'FAIL'} {name}: rel err {err:.2e} (tol "
                f"{tolerance(dtype):.0e}; {time.perf_counter() - t0:.1f} s)"
            )
        except Exception as e:
            b.checks.append(f"FAIL {name}: raised {type(e).__name__}: {str(e)[:400]}")
        print(b.checks[-1], flush=True)
    cfg = curated[0]
    try:
        x, y = normal(next(key), (m, k)), normal(next(key), (k, n))
        dout = normal(next(key), (m, n))
        out, (dx, dy) = _value_and_grads(lambda a, c: ex(kernel, a, c, cfg=cfg), (x, y), dout)
        f32 = (x.astype(jnp.float32), y.astype(jnp.float32))
        ref, (rx, ry) = _value_and_grads(mm_ref, f32, dout.astype(jnp.float32))
        err = max(relative_error(out, ref), relative_error(dx, rx), relative_error(dy, ry))
        ok = err <= 2 * tolerance(BF16)
        b.checks.append(
            f"{'ok  ' if ok else 'FAIL'} mosaic grad bf16 {m}x{k}x{n}: rel err {err:.2e}"
        )
    except Exception as e:
        b.checks.append(f"FAIL mosaic grad: raised {type(e).__name__}: {str(e)[:400]}")
    print(b.checks[-1], flush=True)


def wide_mosaic_space(p: MatmulProblem) -> list[MatmulConfig]:
    """More Mosaic configs than the tuner's curated 16: more tiles, every cluster
    choice, several grid orders, and two pipeline depths each (pruned by the same
    rules), to see whether the curated set misses a faster one."""
    out = []
    tiles = (*mosaic_space.TILES, (128, 128, "n"), (256, 64, "m"))
    grids = (("n", 1), ("n", 8), ("m", 8), ("n", 16))
    for bm, bn, wg in tiles:
        for cluster in (None, "m", "n"):
            for minor, width in grids:
                base = MatmulConfig(
                    backend="mosaic", bm=bm, bn=bn, bk=mosaic_space.BK, wg_dimension=wg,
                    cluster_dimension=cluster, grid_minor_dim=minor, grid_tile_width=width,
                    max_concurrent_steps=1,
                )  # fmt: skip
                deepest = mosaic_space.deepest_steps(p, base, 227 * 1024)
                for steps in (deepest, deepest - 1):
                    out.append(dataclasses.replace(base, max_concurrent_steps=max(steps, 1)))
    kept, _ = mosaic_space.candidates(p, configs=out)
    return kept


def sweep_mosaic(b: Bench, seconds: float) -> None:
    """Times the wide Mosaic space at 4096³ bf16 (in a shuffled order, for `seconds`)
    and prints the fastest configs against `jnp.dot`."""
    import random

    m = k = n = 4096 if not b.smoke else 256
    p = MatmulProblem(m, n, k, jnp.dtype(BF16))
    cands = wide_mosaic_space(p)
    curated = set(mosaic_space.candidates(p)[0])
    random.Random(0).shuffle(cands)
    kx, ky = jax.random.split(jax.random.PRNGKey(11))
    x, y = normal(kx, (m, k)), normal(ky, (k, n))
    kernel = Matmul()
    tuner = Tuner(
        progress=False, strategy="exhaustive", time_budget_s=seconds, compile_timeout_s=60.0
    )
    cands = [CEILING, *cands]

    def make(cfg: Any) -> Callable[..., Any]:
        if cfg == CEILING:
            return lambda a, c: jnp.dot(a, c)
        return functools.partial(kernel.run_triton, cfg=cfg)

    warm_gpu(b)
    t0 = time.perf_counter()
    rep = tuner.tune(make, (x, y), {}, cands, reference_cfg=CEILING)
    wall = time.perf_counter() - t0
    done = [c for c in rep.candidates if c.ok and c.cfg != CEILING]
    failed = [c for c in rep.candidates if not c.ok and c.status not in ("skipped", "pruned")]
    cublas = next((c.time_s for c in rep.candidates if c.cfg == CEILING and c.ok), None)
    flops = 2 * m * n * k
    print(
        f"\n== Mosaic sweep {m}x{k}x{n} bf16: {len(done)} timed, {len(failed)} failed, "
        f"{len(cands) - 1 - len(done) - len(failed)} not reached of {len(cands) - 1}; "
        f"{wall:.0f} s; jnp.dot {flops / cublas / 1e12 if cublas else float('nan'):.0f} TFLOP/s =="
    )
    for c in sorted(done, key=lambda c: c.time_s)[:10]:
        pct = f"{100 * cublas / c.time_s:.0f}%" if cublas else "-"
        mark = "*" if c.cfg in curated else " "
        print(f" {mark} {flops / c.time_s / 1e12:6.0f} TFLOP/s {pct:>5}  {_cfg_text(c.cfg)}")
    for c in failed[:5]:
        print(f"   failed ({c.status}): {_cfg_text(c.cfg)}: {(c.error or '')[:200]}")
    print("   (* = in the tuner's curated space)")


# --- the benchmarks ------------------------------------------------------------------


def copy_bandwidth(b: Bench) -> float:
    """Bytes per second of a large device-to-device copy (bytes read + written)."""
    x = normal(
        jax.random.PRNGKey(1), (256 * 1024 * 1024 // 2 if not b.smoke else 1 << 20,), BF16
    )  # 512 MiB
    warm_gpu(b)
    t = b.time(lambda a: a + 1, x)  # one fused elementwise pass: read once, write once
    return 2 * x.size * 2 / t


def _shapes(b: Bench, module: Any) -> Any:
    if b.smoke:
        return module.DEMO_SHAPES_CPU[:1]
    return module.BENCH_SHAPES[:3] if b.quick else module.BENCH_SHAPES


def bench_matmul(b: Bench) -> Iterator[None]:
    shapes = _shapes(b, matmul_shapes)
    for m, k, n in shapes:
        kx, ky = jax.random.split(jax.random.PRNGKey(m + 7 * k + 13 * n))
        x, y = normal(kx, (m, k)), normal(ky, (k, n))
        shape = f"{m}x{k}x{n} bf16"
        results = b.tune(
            "matmul",
            shape,
            lambda ex, x=x, y=y: ex(kernel_for(Matmul, ex), x, y),
            lambda x=x, y=y: b.time(lambda a, c: jnp.dot(a, c), x, y),
            "jnp.dot (cuBLAS)",
        )
        for r in results:
            if r.tuned_s:
                flops = 2 * m * n * k
                r.ceiling_note += f"; tuned {flops / r.tuned_s / 1e12:.0f} TFLOP/s"
                if r.ceiling_s:
                    r.ceiling_note += f" vs {flops / r.ceiling_s / 1e12:.0f}"
                if r.backend_best_s:
                    r.ceiling_note += "; best per backend: " + ", ".join(
                        f"{name} {flops / t / 1e12:.0f} TFLOP/s"
                        for name, t in sorted(r.backend_best_s.items())
                    )
        kernel = Matmul()
        _recheck(
            b,
            results,
            lambda cfg, kernel=kernel: functools.partial(kernel.run_triton, cfg=cfg),
            (x, y),
            ceiling_fn=lambda a, c: jnp.dot(a, c),
            ceiling_note="jnp.dot (cuBLAS)",
        )
        for r in results[:1]:
            if r.recheck_tuned_s and r.ceiling_s:
                flops = 2 * m * n * k
                r.ceiling_note += (
                    f"; re-timed {flops / r.recheck_tuned_s / 1e12:.0f} vs "
                    f"{flops / r.ceiling_s / 1e12:.0f} TFLOP/s"
                )
        yield


CEILING = "ceiling"


def _recheck(
    b: Bench,
    results: list[Result],
    make_fn: Callable[[Any], Callable[..., Any]],
    args: tuple[Any, ...],
    ceiling_fn: Callable[..., Any] | None = None,
    ceiling_note: str = "",
) -> None:
    """Times the heuristic, the winner and the ceiling (`ceiling_fn`, e.g. `jnp.dot`)
    once more, side by side in interleaved rounds of one session, on a warm GPU: the
    fairest comparison of the three. Fills the re-timed fields, and the ceiling when
    given."""
    r = results[0]
    if r.error or r.heuristic_cfg is None or r.best_cfg is None or b.out_of_time():
        return
    cands: list[Any] = [r.heuristic_cfg]
    if r.best_cfg != r.heuristic_cfg:
        cands.append(r.best_cfg)
    if ceiling_fn is not None:
        cands.append(CEILING)

    def make(cfg: Any) -> Callable[..., Any]:
        return ceiling_fn if cfg == CEILING else make_fn(cfg)  # type: ignore[return-value]

    try:
        warm_gpu(b)
        rep = b.tuner.tune(make, args, {}, cands, reference_cfg=r.heuristic_cfg)
        times = {str(c.cfg): c.time_s for c in rep.candidates}
        r.recheck_heuristic_s = times.get(str(r.heuristic_cfg))
        r.recheck_tuned_s = times.get(str(r.best_cfg))
        ceiling = times.get(CEILING)
        if ceiling and r.recheck_tuned_s:
            r.ceiling_s = ceiling
            r.ceiling_note = ceiling_note + " (same session)"
            r.pct_of_ceiling = 100.0 * ceiling / r.recheck_tuned_s
    except Exception as e:
        r.error = f"recheck failed: {type(e).__name__}: {str(e)[:120]}"


def warm_gpu(b: Bench, seconds: float = 1.0) -> None:
    """Keeps the GPU busy for a moment so its clocks are up before timing (an idle
    H200 sits at a few hundred MHz; the first timings after idling read slow)."""
    if b.smoke:
        return
    x = normal(jax.random.PRNGKey(3), (4096, 4096))
    f = jax.jit(lambda a: a @ a)
    jax.block_until_ready(f(x))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        jax.block_until_ready([f(x) for _ in range(20)])


def bench_attention(b: Bench) -> Iterator[None]:
    shapes = _shapes(b, attention_shapes)
    for bsz, t, h, d, causal in shapes:
        keys = jax.random.split(jax.random.PRNGKey(bsz * t + h + d), 4)
        q, k, v = (normal(kk, (bsz, t, h, d)) for kk in keys[:3])
        shape = f"b{bsz} t{t} h{h} d{d}{' causal' if causal else ''}"

        def call(ex: Executor, q=q, k=k, v=v, causal=causal) -> Any:
            att = kernel_for(Attention, ex)

            def loss(q, k, v):
                return jnp.sum(ex(att, q, k, v, causal=causal).astype(jnp.float32))

            return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

        def cudnn_fwd(q=q, k=k, v=v, causal=causal) -> float:
            return b.time(
                lambda a, c, e: jax.nn.dot_product_attention(
                    a, c, e, is_causal=causal, implementation="cudnn"
                ),
                q,
                k,
                v,
            )

        results = b.tune("attention", shape, call, cudnn_fwd, "cuDNN fwd")
        fwd_kernel = Attention()
        _recheck(
            b,
            results,
            lambda cfg, kern=fwd_kernel, causal=causal, d=d: functools.partial(
                kern.run_triton, cfg=cfg, causal=causal, sm_scale=1.0 / math.sqrt(d)
            ),
            (q, k, v),
            ceiling_fn=lambda a, c, e, causal=causal: jax.nn.dot_product_attention(
                a, c, e, is_causal=causal, implementation="cudnn"
            ),
            ceiling_note="cuDNN fwd",
        )
        try:
            t_fb = b.time(
                jax.grad(
                    lambda a, c, e, causal=causal: jnp.sum(
                        jax.nn.dot_product_attention(
                            a, c, e, is_causal=causal, implementation="cudnn"
                        ).astype(jnp.float32)
                    ),
                    argnums=(0, 1, 2),
                ),
                q,
                k,
                v,
            )
            for r in results:
                if r.kernel == "attention_bwd" and r.tuned_s and results[0].ceiling_s:
                    r.ceiling_s = t_fb - results[0].ceiling_s
                    r.ceiling_note = "cuDNN bwd (fwd+bwd − fwd)"
                    r.pct_of_ceiling = 100.0 * r.ceiling_s / r.tuned_s
        except Exception as e:
            for r in results[1:]:
                r.ceiling_note = f"cuDNN bwd failed: {type(e).__name__}"
        yield


def bench_rowwise(b: Bench, bandwidth: float) -> Iterator[None]:
    jobs = []
    for rows, n in _shapes(b, norm_shapes):
        jobs.append(("layer_norm", LayerNorm, rows, n))
        jobs.append(("rms_norm", RMSNorm, rows, n))
    for rows, n in _shapes(b, softmax_shapes):
        jobs.append(("softmax", Softmax, rows, n))
    for i, (name, kind, rows, n) in enumerate(jobs):
        if i and i % 3 == 0:
            yield
        kx, kw, kb = jax.random.split(jax.random.PRNGKey(rows + n), 3)
        x = normal(kx, (rows, n))
        params: tuple[Any, ...] = ()
        if name == "layer_norm":
            params = (normal(kw, (n,), scale=0.1) + 1, normal(kb, (n,), scale=0.1))
        elif name == "rms_norm":
            params = (normal(kw, (n,), scale=0.1) + 1,)
        moved = 2 * rows * n * 2
        b.tune(
            name,
            f"{rows}x{n} bf16",
            lambda ex, kind=kind, x=x, params=params: ex(kernel_for(kind, ex), x, *params),
            None,
            "HBM copy bandwidth",
            bytes_moved=moved,
            bandwidth=bandwidth,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three shapes per kernel")
    parser.add_argument(
        "--budget-s", type=float, default=330.0, help="stop starting new tunings after this long"
    )
    parser.add_argument("--json", help="write every result here")
    parser.add_argument(
        "--only",
        default="check,mosaic,matmul,attention,rowwise",
        help="comma-separated: check, mosaic (Mosaic matmul checks), matmul, attention, "
        "rowwise, sweep (wide Mosaic sweep at 4096³)",
    )
    parser.add_argument(
        "--sweep-s", type=float, default=60.0, help="time budget of the Mosaic sweep"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny shapes, any device (with KERNELTUNE_PLATFORM=triton on a CPU: the Pallas interpreter)",
    )
    args = parser.parse_args()
    device = jax.devices()[0]
    print(
        f"device: {device.device_kind} ({device.platform}); jax {jax.__version__}; date {time.strftime('%Y-%m-%d')}"
    )
    if device.platform != "gpu" and not args.smoke:
        print("not a GPU: nothing to benchmark (--smoke runs tiny shapes anywhere)")
        return 1
    b = Bench(args.quick, args.budget_s, smoke=args.smoke)
    only = set(args.only.split(","))
    t0 = time.perf_counter()
    if "check" in only:
        try:
            check_all(b)
        except Exception:
            traceback.print_exc()
            b.checks.append("FAIL check_all raised (traceback above)")
        print("\n".join(b.checks), flush=True)
        print(f"checks took {time.perf_counter() - t0:.1f} s", flush=True)
    if "mosaic" in only:
        t1 = time.perf_counter()
        try:
            check_mosaic(b)
        except Exception:
            traceback.print_exc()
            b.checks.append("FAIL check_mosaic raised (traceback above)")
        print(f"Mosaic checks took {time.perf_counter() - t1:.1f} s", flush=True)
    bandwidth = copy_bandwidth(b)
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s", flush=True)
    # Round robin over the kernels, so that a time budget that runs out leaves every
    # kernel with some shapes rather than some kernels with none.
    gens = []
    if "matmul" in only:
        gens.append(bench_matmul(b))
    if "attention" in only:
        gens.append(bench_attention(b))
    if "rowwise" in only:
        gens.append(bench_rowwise(b, bandwidth))
    printed = 0
    _print([])
    while gens:
        for g in list(gens):
            if next(g, StopIteration) is StopIteration:
                gens.remove(g)
            _print(b.results[printed:], header=False)
            printed = len(b.results)
    # The sweep gets what is left of the budget plus its own time, at most its own time.
    sweep_s = min(args.sweep_s, b.deadline - time.perf_counter() + args.sweep_s)
    if "sweep" in only and sweep_s >= 15:
        try:
            sweep_mosaic(b, sweep_s)
        except Exception:
            traceback.print_exc()
    elif "sweep" in only:
        print(f"Mosaic sweep skipped: {sweep_s:.0f} s left of its budget")
    print(
        f"\n== results ({device.device_kind}, {time.strftime('%Y-%m-%d')}, total {time.perf_counter() - t0:.0f} s) =="
    )
    _print(b.results)
    if b.checks:
        print("\n".join(c for c in b.checks if not c.startswith("ok")) or "all checks passed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": device.device_kind,
                    "jax": jax.__version__,
                    "checks": b.checks,
                    "results": [dataclasses.asdict(r) for r in b.results],
                },
                f,
                indent=1,
            )
    return 0


def _print(results: list[Result], header: bool = True) -> None:
    def t(s: float | None) -> str:
        return "-" if s is None else (f"{s * 1e3:.3f}ms" if s >= 1e-4 else f"{s * 1e6:.1f}us")

    if header:
        print(
            f"{'kernel':<14}{'shape':<26}{'heuristic':>11}{'tuned':>11}{'speedup':>8}{'%ceil':>7}"
            f"{'tune s':>7}{'cands':>7}  winner / ceiling"
        )
    for r in results:
        if r.error:
            print(f"{r.kernel:<14}{r.shape:<26}  {r.error}")
            continue
        sp = f"{r.heuristic_s / r.tuned_s:.2f}x" if r.heuristic_s and r.tuned_s else "-"
        pct = f"{r.pct_of_ceiling:.0f}%" if r.pct_of_ceiling else "-"
        print(
            f"{r.kernel:<14}{r.shape:<26}{t(r.heuristic_s):>11}{t(r.tuned_s):>11}{sp:>8}{pct:>7}"
            f"{(r.tuning_s or 0):>7.1f}{r.candidates:>4}/{r.failed:<2}  {r.winner} | {r.ceiling_note}{_recheck_text(r)}",
            flush=True,
        )


def _recheck_text(r: Result) -> str:
    if r.recheck_heuristic_s and r.recheck_tuned_s:
        return f" | re-timed: heuristic/tuned {r.recheck_heuristic_s / r.recheck_tuned_s:.3f}x"
    return ""


if __name__ == "__main__":
    sys.exit(main())
