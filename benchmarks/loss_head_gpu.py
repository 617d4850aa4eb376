"""The loss head (`linear_softmax_cross_entropy`) and the gated linear unit
(`gated_linear_unit`) against plain JAX and tokamax, and a small Llama-style model's
training step built on both (issue 29).

    python -m benchmarks.loss_head_gpu [--quick] [--json OUT.json] [--no-tune]
    python -m benchmarks.loss_head_gpu --smoke      # tiny shapes, any device, wall clock
    python -m benchmarks.loss_head_gpu --ops loss_head --sweep   # each memory config too

Run from the repository root on a GPU. Its budget (an estimate, not yet measured): about
5 minutes on an H100 — each implementation compiled once, 5 s of tuning per kerneltune
key, 3 interleaved timing rounds; `--quick` (two shapes per op, 3 s, 2 rounds) about
half that. Per op, shape and pass (forward; forward +
backward of the mean loss, or of the GLU output's sum): plain JAX (the logits
materialised; two `jnp.dot`s and `jax.nn.silu`), tokamax (when it imports:
`linear_softmax_cross_entropy_loss`, `gated_linear_unit`), kerneltune with its
heuristic config and tuned from an empty cache. Columns: median device time (CUPTI on
a GPU), ratio to plain JAX (> 1: faster), first-call wall (tracing, tuning for the
tuned column, compiling) and peak device memory of the compiled program (XLA's buffer
assignment: arguments, outputs and temporaries). Then the model: token embedding, two
Llama blocks (RMSNorm, grouped-query attention through `kerneltune.kernels.attention`,
SwiGLU through `gated_linear_unit`), a final RMSNorm and a 128k-vocabulary head through
`linear_softmax_cross_entropy`: one jitted `value_and_grad` step, against the same model
in plain JAX and on tokamax's ops. To bring tokamax (no network on the GPU machine):
`pip install --no-index --no-deps --target /tmp/site .whl/*.whl`, then
`PYTHONPATH=/tmp/site python -m benchmarks.loss_head_gpu`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import kerneltune as kt
from benchmarks import harness as h
from benchmarks import model_blocks as mb
from benchmarks import op_bench
from kerneltune import kernels as ktk
from kerneltune.kernels.cross_entropy import shapes as loss_shapes
from kerneltune.kernels.gated_linear_unit import shapes as glu_shapes

IMPLS = ("plain", "plain_bf16", "tokamax", "kt_heuristic", "kt_tuned")
#: The plain-JAX variants a user may write; ratios are against the fastest of them.
PLAINS = ("plain", "plain_bf16")
#: The tuner's seconds per key and the interleaved timing rounds, by default and with
#: `--quick` (or `--smoke`).
TUNE_BUDGET_S, QUICK_TUNE_BUDGET_S = 5.0, 3.0
ROUNDS, QUICK_ROUNDS = 3, 2
F32 = jnp.float32


@dataclasses.dataclass
class Result:
    """One op at one shape and pass, or the model's step: by implementation."""

    op: str
    pass_: str
    shape: str
    times: dict[str, float] = dataclasses.field(default_factory=dict)
    first_call_s: dict[str, float] = dataclasses.field(default_factory=dict)
    peak_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    tuned_backend: str = "-"

    def fastest(self, names: Sequence[str]) -> float | None:
        """The lowest time among `names` (those measured), or None."""
        times = [self.times[n] for n in names if self.times.get(n)]
        return min(times) if times else None

    def ratio(self, name: str, base: str | None = None) -> float | None:
        """`base`'s time ÷ `name`'s (> 1: `name` is faster); by default the fastest
        plain-JAX variant measured."""
        a = self.fastest(PLAINS) if base is None else self.times.get(base)
        b = self.times.get(name)
        return a / b if a and b else None

    def peer_ratio(self, name: str) -> float | None:
        """The fastest of plain JAX and tokamax ÷ `name`'s time: the issue's bar for a
        kerneltune column (> 1: faster than whatever a user has)."""
        a, b = self.fastest((*PLAINS, "tokamax")), self.times.get(name)
        return a / b if a and b else None


@dataclasses.dataclass(frozen=True)
class Settings:
    tune: bool
    tune_budget_s: float
    rounds: int
    tokamax: Any
    sweep: bool = False


def sweep_configs() -> dict[str, Any]:
    """`--sweep`: the loss head's memory-for-speed configs, each as its own column
    (`kt_<backend>_<chunk>_<logits dtype>`), so the trade each makes is on the table."""
    from kerneltune.kernels.cross_entropy import config as cc

    out = {"kt_xla_input": cc.XLA_INPUT_LOGITS, "kt_xla_f32": cc.XLA}
    for chunk in (1024, 2048, 4096):
        out[f"kt_chunked_{chunk}_input"] = cc.chunked(chunk, "input")
    for chunk in (1024, 2048):
        out[f"kt_chunked_{chunk}_f32"] = cc.chunked(chunk, "float32")
    return out


# --- the implementations ------------------------------------------------------------


def plain_loss(x: jax.Array, labels: jax.Array, w: jax.Array) -> jax.Array:
    """What a JAX user writes: the float32 logits, `logsumexp`, the label's logit."""
    logits = jnp.dot(x, w, preferred_element_type=F32)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def plain_loss_bf16_logits(x: jax.Array, labels: jax.Array, w: jax.Array) -> jax.Array:
    """The other form users write: logits in the inputs' dtype (16-bit matmuls forward
    and backward), upcast for the log-sum-exp."""
    logits = jnp.dot(x, w).astype(F32)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def plain_glu(x: jax.Array, w: jax.Array) -> jax.Array:
    return jax.nn.silu(jnp.dot(x, w[:, 0])) * jnp.dot(x, w[:, 1])


def tokamax_loss(tokamax: Any) -> Callable[..., jax.Array]:
    def loss(x: jax.Array, labels: jax.Array, w: jax.Array) -> jax.Array:
        try:  # tokamax 0.0.17's GPU path; a later one may pick its own default
            return tokamax.linear_softmax_cross_entropy_loss(  # type: ignore[no-any-return]
                x, labels, w, reduction="mean", implementation="chunked_xla"
            )
        except ValueError:
            return tokamax.linear_softmax_cross_entropy_loss(x, labels, w, reduction="mean")  # type: ignore[no-any-return]

    return loss


def tokamax_glu(tokamax: Any) -> Callable[..., jax.Array]:
    return lambda x, w: tokamax.gated_linear_unit(x, w, activation=jax.nn.silu)


def implementations(
    op: str, st: Settings
) -> tuple[dict[str, Callable[..., jax.Array]], op_bench.Tuning | None]:
    heuristic = op_bench.heuristic_executor()
    tuning = op_bench.tuning_executor(st.tune_budget_s, shipped=True) if st.tune else None
    if op == "loss_head":

        def kt_loss(ex: Any, cfg: Any = None) -> Callable[..., jax.Array]:
            return lambda x, labels, w: ktk.linear_softmax_cross_entropy(
                x, labels, w, cfg=cfg, executor=ex
            )

        out: dict[str, Callable[..., jax.Array]] = {
            "plain": plain_loss,
            "plain_bf16": plain_loss_bf16_logits,
            "kt_heuristic": kt_loss(heuristic),
        }
        if st.tokamax is not None:
            out["tokamax"] = tokamax_loss(st.tokamax)
        if tuning is not None:
            out["kt_tuned"] = kt_loss(tuning.executor)
        if st.sweep:
            for name, cfg in sweep_configs().items():
                out[name] = kt_loss(heuristic, cfg)
        return out, tuning

    def kt_glu(ex: Any) -> Callable[..., jax.Array]:
        return lambda x, w: ktk.gated_linear_unit(x, w, activation=jax.nn.silu, executor=ex)

    out = {"plain": plain_glu, "kt_heuristic": kt_glu(heuristic)}
    if st.tokamax is not None:
        out["tokamax"] = tokamax_glu(st.tokamax)
    if tuning is not None:
        out["kt_tuned"] = kt_glu(tuning.executor)
    return out, tuning


def with_backward(op: str, f: Callable[..., jax.Array]) -> Callable[..., Any]:
    """The training form: the value and the gradients with respect to x and the
    weights (the loss is already a scalar; the GLU's output is summed)."""
    if op == "loss_head":
        return jax.value_and_grad(f, argnums=(0, 2))
    return jax.value_and_grad(lambda x, w: f(x, w).astype(F32).sum(), argnums=(0, 1))


# --- measuring ------------------------------------------------------------------------


def peak_bytes(compiled: Any) -> int:
    """Peak device memory of a compiled program by XLA's buffer assignment: arguments +
    outputs + temporaries (less what outputs alias); 0 where XLA does not say."""
    m = compiled.memory_analysis()
    if m is None:
        return 0
    total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    return int(total - getattr(m, "alias_size_in_bytes", 0))


def compile_and_run(
    fn: Callable[..., Any], args: Sequence[Any], context: Any = None
) -> tuple[Any, float]:
    """`fn` traced (the tuned column tunes here), compiled and run once: the compiled
    program and that first call's wall seconds. One compilation serves the first call,
    the memory figure and the timing sessions."""
    t0 = time.perf_counter()
    with context if context is not None else contextlib.nullcontext():
        compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    return compiled, time.perf_counter() - t0


def compiled_session(compiled: Any, sets: Sequence[Any]) -> Callable[[], float]:
    """`harness.session` for an already compiled program: each call of the result runs
    one session and returns the median seconds per call (CUPTI on a GPU)."""
    out_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(compiled.out_info))
    calls = h.session_calls(statistics.median(h.call_times(compiled, sets, 2)), out_bytes)
    return lambda: statistics.median(h.call_times(compiled, sets, calls))


def measure(
    result: Result, fns: dict[str, Callable[..., Any]], sets: Sequence[Any], st: Settings
) -> Result:
    sessions = {}
    for name, fn in fns.items():
        try:
            compiled, result.first_call_s[name] = compile_and_run(fn, sets[0])
            result.peak_bytes[name] = peak_bytes(compiled)
            sessions[name] = compiled_session(compiled, sets)
        except Exception as e:  # one failing implementation must not end the run
            result.errors[name] = h.error_text(e)
        progress(result, name)
    return timed(result, sessions, st)


def timed(result: Result, sessions: dict[str, Any], st: Settings) -> Result:
    """Times `sessions` in interleaved rounds into `result`, printing each time as soon
    as it is known (a long run may be cut short)."""
    try:
        result.times.update(h.interleaved_times(sessions, rounds=st.rounds))
    except Exception as e:
        result.errors["timing"] = h.error_text(e)
    for name, t in result.times.items():  # as soon as known: a long run may be cut short
        ratio = result.ratio(name)
        peak = result.peak_bytes.get(name)
        print(
            f"  {result.op} {result.pass_} {result.shape} {name}: {_ms(t)} ms"
            f" ({'-' if ratio is None else f'{ratio:.2f}'}x best plain), peak "
            f"{'-' if peak is None else f'{peak / 2**30:.2f}'} GiB",
            file=sys.stderr,
            flush=True,
        )
    return result


def progress(result: Result, name: str) -> None:
    what = result.errors.get(name) or f"first call {result.first_call_s.get(name, 0):.1f} s"
    print(
        f"  {result.op} {result.pass_} {result.shape} {name}: {what}", file=sys.stderr, flush=True
    )


def op_results(op: str, shape: tuple[int, int, int], st: Settings) -> list[Result]:
    m, k, n = shape
    if op == "loss_head":

        def make(seed: int) -> tuple[Any, ...]:
            labels = jax.random.randint(jax.random.key(seed), (m,), 0, n)
            return h.normal(2 * seed, (m, k)), labels, h.normal(2 * seed + 1, (k, n)) * 0.05

    else:

        def make(seed: int) -> tuple[Any, ...]:
            return h.normal(2 * seed, (m, k)), h.normal(2 * seed + 1, (k, 2, n)) * 0.05

    sets = h.arg_sets(make)
    out = []
    for pass_ in ("fwd", "fwd+bwd"):
        fns, tuning = implementations(op, st)
        if pass_ == "fwd+bwd":
            fns = {name: with_backward(op, f) for name, f in fns.items()}
        result = Result(op, pass_, f"{m}x{k}x{n}")
        measure(result, fns, sets, st)
        if tuning is not None:
            result.tuned_backend = op_bench.backend_of(tuning.chosen)
            for line in tuning.summary():
                print(f"  tuning {op} {pass_} {result.shape}: {line}", file=sys.stderr, flush=True)
        out.append(result)
    return out


# --- the model ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelShape:
    block: mb.BlockShape
    vocab: int
    blocks: int = 2

    def __str__(self) -> str:
        return f"{self.block} V{self.vocab} x{self.blocks} blocks"


MODEL = ModelShape(mb.BlockShape(4, 2048, 2048, 16, 4, 5632), vocab=128256)
MODEL_SMOKE = ModelShape(mb.BlockShape(1, 64, 64, 4, 2, 96), vocab=256)


def model_params(s: ModelShape) -> dict[str, Any]:
    d = s.block.dim
    return {
        "embed": h.normal(11, (s.vocab, d)),
        "blocks": [mb.llama_params(s.block) for _ in range(s.blocks)],
        "norm": jnp.ones((d,), jnp.bfloat16),
        "head": h.normal(12, (d, s.vocab)) * jnp.bfloat16(1 / d**0.5),
    }


def model_step(ops: mb.Ops, loss: Callable[..., jax.Array], s: ModelShape) -> Callable[..., Any]:
    """`jit(value_and_grad(loss))(params, tokens, labels)`: embedding, the blocks, the
    final norm and the loss head."""

    def loss_fn(p: dict[str, Any], tokens: jax.Array, labels: jax.Array) -> jax.Array:
        x = p["embed"][tokens]
        for bp in p["blocks"]:
            x = mb.llama_block(ops, bp, x, s.block)
        hidden = ops.rms_norm(x, p["norm"]).reshape(-1, s.block.dim)
        return loss(hidden, labels.reshape(-1), p["head"])

    return jax.jit(jax.value_and_grad(loss_fn))


def model_args(s: ModelShape) -> tuple[dict[str, Any], jax.Array, jax.Array]:
    """The model step's arguments: parameters, random tokens and labels."""
    tokens_shape = (s.block.batch, s.block.seq)
    tokens = jax.random.randint(jax.random.key(1), tokens_shape, 0, s.vocab)
    labels = jax.random.randint(jax.random.key(2), tokens_shape, 0, s.vocab)
    return model_params(s), tokens, labels


def model_result(s: ModelShape, st: Settings) -> Result:
    args = model_args(s)
    result = Result("model", "train", str(s))
    heuristic = op_bench.heuristic_executor()
    variants: dict[str, tuple[mb.Ops, Callable[..., jax.Array]]] = {
        "plain": (mb.plain_ops(), plain_loss),
        "plain_bf16": (mb.plain_ops(), plain_loss_bf16_logits),
        "kt_heuristic": (
            mb.kerneltune_ops(heuristic),
            functools.partial(ktk.linear_softmax_cross_entropy, executor=heuristic),
        ),
    }
    if st.tokamax is not None:
        variants["tokamax"] = (mb.tokamax_ops(st.tokamax), tokamax_loss(st.tokamax))
    sessions = {}
    for name, (ops, loss) in variants.items():
        try:
            step = model_step(ops, loss, s)
            compiled, result.first_call_s[name] = compile_and_run(step, args)
            result.peak_bytes[name] = peak_bytes(compiled)
            sessions[name] = compiled_session(compiled, [args])
        except Exception as e:
            result.errors[name] = h.error_text(e)
        progress(result, name)
    if st.tune:
        # The shipped tables too, as the default executor reads them: the model's
        # matmuls, norms and attention have H100/H200 entries there.
        tuning = op_bench.tuning_executor(st.tune_budget_s, shipped=True)
        kt.set_default_executor(tuning.executor)  # what `kt.autotune(f)` and the ops use
        try:
            step = model_step(mb.kerneltune_ops(), ktk.linear_softmax_cross_entropy, s)
            context, tune_s, how = op_bench.tune_function(step, args)
            print(f"  model kt_tuned: {how}", file=sys.stderr, flush=True)
            for op_id, cfg in tuning.chosen:
                print(f"    tuned {op_id}: {cfg}", file=sys.stderr, flush=True)
            compiled, first = compile_and_run(step, args, context)
            result.first_call_s["kt_tuned"] = tune_s + first
            result.peak_bytes["kt_tuned"] = peak_bytes(compiled)
            sessions["kt_tuned"] = compiled_session(compiled, [args])
            result.tuned_backend = op_bench.backend_of(tuning.chosen)
        except Exception as e:
            result.errors["kt_tuned"] = h.error_text(e)
        finally:
            kt.set_default_executor(None)
        progress(result, "kt_tuned")
    return timed(result, sessions, st)


# --- output ---------------------------------------------------------------------------


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.2f}"


def table(results: Sequence[Result]) -> str:
    head = ["op", "pass", "shape"]
    names = list(IMPLS)
    names += [n for r in results for n in r.times if n not in names]
    for name in names:
        head += [f"{name} ms", f"{name} ×best plain", f"{name} 1st s", f"{name} GiB"]
    kts = [n for n in names if n.startswith("kt_")]
    head += [f"{name} ×best peer" for name in kts] + ["tuned backend"]
    lines = [head]
    for r in results:
        cells = [r.op, r.pass_, r.shape]
        for name in names:
            ratio = r.ratio(name)
            first = r.first_call_s.get(name)
            peak = r.peak_bytes.get(name)
            cells += [
                _ms(r.times.get(name)),
                "-" if ratio is None else f"{ratio:.2f}",
                "-" if first is None else f"{first:.1f}",
                "-" if peak is None else f"{peak / 2**30:.2f}",
            ]
        for name in kts:
            ratio = r.peer_ratio(name)
            cells.append("-" if ratio is None else f"{ratio:.3f}")
        cells.append(r.tuned_backend)
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    errors = [
        f"  {r.op} {r.pass_} {r.shape} {k}: {e}" for r in results for k, e in r.errors.items()
    ]
    return "\n".join(text + (["errors:", *errors] if errors else []))


def main(argv: Sequence[str] | None = None) -> list[Result]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="two shapes per op, shorter tuning")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, no tokamax (any device)")
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    p.add_argument("--ops", default="loss_head,glu,model", help="subset of loss_head,glu,model")
    p.add_argument("--no-tune", action="store_true", help="skip the kerneltune tuned column")
    p.add_argument("--tune-budget", type=float, default=None, help="tuner seconds per key")
    p.add_argument("--no-tokamax", action="store_true", help="do not import tokamax")
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved timing rounds (default 3, --quick 2): under sustained load an "
        "H100 runs at its power cap and one session's time spreads by ±5%%, so ratios of "
        "near-identical programs need about 9",
    )
    p.add_argument(
        "--sweep", action="store_true", help="also time each loss-head memory config by itself"
    )
    args = p.parse_args(argv)
    tokamax = None if args.smoke or args.no_tokamax else mb.import_tokamax()
    short = args.quick or args.smoke
    budget = args.tune_budget or (QUICK_TUNE_BUDGET_S if short else TUNE_BUDGET_S)
    rounds = args.rounds if args.rounds is not None else QUICK_ROUNDS if short else ROUNDS
    if rounds < 1:
        p.error(f"--rounds must be at least 1, got {rounds}")
    st = Settings(not args.no_tune, budget, rounds, tokamax, args.sweep)
    count = 1 if args.smoke else 2 if args.quick else None
    shapes = {
        "loss_head": loss_shapes.SMOKE_SHAPES if args.smoke else loss_shapes.BENCH_SHAPES,
        "glu": glu_shapes.SMOKE_SHAPES if args.smoke else glu_shapes.BENCH_SHAPES,
    }
    ops = args.ops.split(",")
    results = []
    for op in ("loss_head", "glu"):
        if op in ops:
            for shape in shapes[op][:count]:
                results += op_results(op, shape, st)
    if "model" in ops:
        results.append(model_result(MODEL_SMOKE if args.smoke else MODEL, st))
    print(table(results))
    if args.json:
        device = jax.devices()[0]
        doc = {
            "device": getattr(device, "device_kind", device.platform),
            "jax": jax.__version__,
            "tokamax": getattr(tokamax, "__version__", None),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "timer": "cupti" if h.on_gpu() else "wallclock",
            "command": " ".join(["python -m benchmarks.loss_head_gpu", *(argv or sys.argv[1:])]),
            "results": [dataclasses.asdict(r) for r in results],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return results


if __name__ == "__main__":
    main()
