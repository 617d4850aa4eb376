"""Does a program's speed depend on how busy the GPU was before it? The gated linear
unit's programs timed two ways in one run:

- *burst*: the GPU idle for a moment, then a few calls (how the tuner samples: about
  1 ms of calls per sample, between other work on the host);
- *sustained*: half a second of calls first, then the timed calls (how a training step
  runs: the GPU never idles).

A matmul-bound program at full power may lower the GPU's clock; one that moves fewer
bytes draws less power. If the two regimes rank the programs differently, a tuner
that samples in bursts picks for a GPU that training never sees.

    python -m benchmarks.duty_cycle_gpu [--rounds 7] [--shapes 8192x4096x14336,...]

Prints per program and regime the median of the rounds (CUPTI device time per call),
the ratio to plain JAX in the same regime, and the spread over rounds. Also runs the
tuner on each key and prints what it timed. Pass `--smi FILE` to log the SM clock and
power (`nvidia-smi`, every 100 ms) while it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from benchmarks import harness as h
from benchmarks import loss_head_gpu, op_bench
from kerneltune import kernels as ktk
from kerneltune.kernels.gated_linear_unit.config import GLUConfig

IDLE_S = 0.05  # the idle gap before a burst sample
BURST_CALLS = 3
SUSTAIN_S = 0.5  # untimed calls before a sustained sample
SUSTAINED_CALLS = 30


def programs(tokamax: Any) -> dict[str, Callable[..., jax.Array]]:
    def kt_cfg(backend: str) -> Callable[..., jax.Array]:
        cfg = GLUConfig(backend=backend)  # type: ignore[arg-type]
        return lambda x, w: ktk.gated_linear_unit(x, w, cfg=cfg)

    out: dict[str, Callable[..., jax.Array]] = {
        "plain": loss_head_gpu.plain_glu,
        "xla": kt_cfg("xla"),
        "xla_split": kt_cfg("xla_split"),
    }
    if tokamax is not None:
        out["tokamax"] = loss_head_gpu.tokamax_glu(tokamax)
    return out


def training(f: Callable[..., jax.Array]) -> Callable[..., Any]:
    """The value and gradients of the output's sum (`loss_head_gpu`'s training form)."""
    return loss_head_gpu.with_backward("glu", f)


def burst(compiled: Any, sets: Sequence[Any], idle_s: float = IDLE_S) -> float:
    time.sleep(idle_s)
    return statistics.median(h.call_times(compiled, sets, BURST_CALLS))


def sustained(compiled: Any, sets: Sequence[Any], sustain_s: float = SUSTAIN_S) -> float:
    end, i = time.perf_counter() + sustain_s, 0
    while time.perf_counter() < end:
        out = compiled(*sets[i % len(sets)])
        i += 1
        if i % 8 == 0:
            jax.block_until_ready(out)  # keep the queue short
    jax.block_until_ready(out)
    return statistics.median(h.call_times(compiled, sets, SUSTAINED_CALLS))


def run_shape(
    shape: tuple[int, int, int], pass_: str, rounds: int, tokamax: Any
) -> dict[tuple[str, str], list[float]]:
    """Prints the table of one shape and pass, then what the tuner timed there; returns
    the samples by (regime, program)."""
    m, k, n = shape
    sets = h.arg_sets(lambda s: (h.normal(2 * s, (m, k)), h.normal(2 * s + 1, (k, 2, n)) * 0.05))
    fns = programs(tokamax)
    if pass_ == "fwd+bwd":
        fns = {name: training(f) for name, f in fns.items()}
    compiled = {name: jax.jit(f).lower(*sets[0]).compile() for name, f in fns.items()}
    for c in compiled.values():
        jax.block_until_ready(c(*sets[0]))
    samples: dict[tuple[str, str], list[float]] = {}
    names = list(compiled)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for regime, timer in (("burst", burst), ("sustained", sustained)):
            for name in order:
                samples.setdefault((regime, name), []).append(timer(compiled[name], sets))
    label = f"{m}x{k}x{n} {pass_}"
    print(f"\n{label}  ({time.strftime('%H:%M:%S')})")
    print("| program | burst ms (× plain) | spread | sustained ms (× plain) | spread |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        cells = []
        for regime in ("burst", "sustained"):
            v = samples[(regime, name)]
            base = statistics.median(samples[(regime, "plain")])
            med = statistics.median(v)
            cells += [
                f"{med * 1e3:.3f} ({base / med:.3f}×)",
                f"{min(v) * 1e3:.3f}–{max(v) * 1e3:.3f}",
            ]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    tuning = op_bench.tuning_executor(None)
    kt_fn = lambda x, w: ktk.gated_linear_unit(x, w, executor=tuning.executor)  # noqa: E731
    fn = training(kt_fn) if pass_ == "fwd+bwd" else kt_fn
    jax.block_until_ready(jax.jit(fn)(*sets[0]))
    for line in tuning.summary(best=6):
        print(f"  tuner {label}: {line}", flush=True)
    return samples


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds, then medians")
    p.add_argument(
        "--shapes",
        default="8192x4096x14336,16384x2048x8192",
        help="TOKENSxDxHIDDEN of the gated linear unit, comma-separated",
    )
    p.add_argument("--passes", default="fwd,fwd+bwd", help="fwd, fwd+bwd or both")
    p.add_argument("--smi", default=None, help="log nvidia-smi clocks and power to this file")
    p.add_argument("--smoke", action="store_true", help="a tiny shape, one round, any device")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    tokamax = None
    if args.smoke:
        args.shapes, args.rounds = "64x32x64", 1
    else:
        with contextlib.suppress(ImportError):
            import tokamax
    logger = None
    if args.smi:
        query = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
        with open(args.smi, "w") as f:
            try:
                logger = subprocess.Popen(
                    ["nvidia-smi", f"--query-gpu={query}", "--format=csv", "-lms", "100"],
                    stdout=f,
                )
            except OSError as e:  # no nvidia-smi: time without the log
                print(f"--smi: cannot run nvidia-smi ({e}); no clock log", file=sys.stderr)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}", file=sys.stderr)
    try:
        for text in args.shapes.split(","):
            shape = tuple(int(d) for d in text.split("x"))
            for pass_ in args.passes.split(","):
                run_shape(shape, pass_, args.rounds, tokamax)  # type: ignore[arg-type]
    finally:
        if logger is not None:
            logger.terminate()


if __name__ == "__main__":
    main()
