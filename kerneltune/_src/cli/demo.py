"""`kerneltune demo`: each bundled op against what a user would call instead.

For every row of `demo_cases.py` (the MoE grouped matmul and an MoE layer's training
step, attention plain and with a sliding window, the loss head, the GLU, a norm, a
matmul and softmax) it measures plain JAX, tokamax where it imports and has the op,
kerneltune untuned (its heuristic configs) and kerneltune as the default policy
chooses (the tables shipped for this GPU, else a first call tuned within the
first-call budget; never a full search): time per call, the first call's wall, the
compiled program's peak memory. It prints two tables and a one-line summary, then
reads back what the next run would choose from the persistent cache this one filled
(tracing only, timing nothing), and saves the comparison beside that cache for
`kerneltune report`.

On a CPU the rows are tiny and kerneltune's Pallas kernels run in the Pallas
interpreter: the path is real, the timings mean nothing, and a sample of the GPU table
from BENCHMARKS.md follows.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax

from kerneltune._src.cli import demo_cases, demo_executors, demo_results, demo_sample
from kerneltune._src.cli.demo_measure import (
    CPU_ROUNDS,
    GPU_ROUNDS,
    NA,
    OK,
    Built,
    Measured,
    Rounds,
    error_line,
    first_call,
    interleaved,
    leaves,
    shared_with,
    status_of,
)
from kerneltune._src.cli.demo_results import Comparison, Row, print_comparison, print_table, say
from kerneltune._src.cli.errors import CommandError
from kerneltune._src.core import devices

#: Argument sets smaller than this are timed in turn with a second set, so that a call
#: does not read what the previous one left in a GPU's L2 cache (50 MiB on an H100).
ROTATE_BELOW_BYTES = 100 * 2**20


class Recorder:
    """Collects the chosen column's selection events, row by row."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **data: Any) -> None:
        self.events.append((event, data))

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        out, self.events = self.events, []
        return out


def chosen_from(events: list[tuple[str, dict[str, Any]]]) -> tuple[str, str, list[Any]]:
    """Where the chosen column's configs came from ("shipped 2, budget-tuned 1"), their
    backends ("cudnn+xla"), and the (device, op id, call key) of the keys it tuned."""
    source: dict[tuple[str, str, str], str] = {}
    backend: dict[tuple[str, str, str], str] = {}
    tuned = []
    for event, data in events:
        key = (str(data.get("device")), str(data.get("op_id")), str(data.get("call_key")))
        if event == "autotune_finish":
            report = data.get("report")
            if report is not None and getattr(report, "best", True) is None:
                # Nothing timed in its budget (or every candidate failed): it was not
                # tuned and nothing was stored; the config it then got is named next.
                continue
            source[key] = "budget-tuned" if getattr(report, "budgeted", False) else "tuned"
            tuned.append(key)
        elif event in ("cache_hit", "predicted", "heuristics", "override", "overlay_hit"):
            level = str(data.get("level", event)).replace("heuristics", "heuristic")
            source.setdefault(key, level.replace("overlay_hit", "overlay"))
        else:
            continue
        name = getattr(data.get("cfg"), "backend", None)
        if name is not None:
            backend[key] = str(name)
    counts = Counter(source.values())
    where = ", ".join(f"{s} {n}" if len(source) > 1 else s for s, n in counts.most_common())
    return where, "+".join(sorted(set(backend.values()))), tuned


def _tokamax(args: argparse.Namespace) -> tuple[Any, str]:
    if getattr(args, "no_tokamax", False):
        return None, "left out (--no-tokamax)"
    try:
        module = importlib.import_module("tokamax")
    except ModuleNotFoundError as e:
        if e.name == "tokamax":
            return None, "not installed"
        return None, f"does not import ({error_line(e)})"
    except Exception as e:  # present without its dependencies, or broken
        return None, f"does not import ({error_line(e)})"
    return module, str(getattr(module, "__version__", "(version unknown)"))


def selected(ops: str | None, cases: list[demo_cases.Case]) -> list[demo_cases.Case]:
    """The rows `--ops` names (all when None), in the demo's order."""
    if not ops:
        return cases
    wanted = [o.strip() for o in ops.split(",") if o.strip()]
    unknown = sorted(set(wanted) - {c.name for c in cases})
    if unknown or not wanted:
        raise CommandError(
            f"--ops: unknown row(s) {unknown or ops!r}; choose from {','.join(c.name for c in cases)}."
        )
    return [c for c in cases if c.name in wanted]


def input_programs(cases: list[demo_cases.Case]) -> dict[str, Callable[[int], Any]]:
    """Each row's input program (`case.args`: one program a row makes its inputs with,
    from a seed), compiled before the rows run: traced one after another, compiled all
    at once (XLA compiles off Python's lock). One by one, row by row, they were 9 s of
    the demo on an H200; none of it is a measured column's. A row whose program fails
    here is left out: `measure_row` compiles it itself, and reports what fails."""
    lowered = {}
    for case in cases:
        try:
            lowered[case.name] = jax.jit(case.args).lower(0)
        except Exception:  # measure_row meets it again, and says what went wrong
            continue
    if not lowered:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(lowered)) as pool:
        futures = {name: pool.submit(low.compile) for name, low in lowered.items()}
    made: dict[str, Callable[[int], Any]] = {}
    for name, future in futures.items():
        if future.exception() is None:
            made[name] = future.result()
    return made


def measure_row(
    case: demo_cases.Case,
    implementations: dict[str, Any],
    plan: Rounds,
    recorder: Recorder,
    rotate: bool,
    make: Callable[[int], Any] | None = None,
) -> tuple[Row, list[Any], str, dict[str, float]]:
    """Every implementation's first call, then their interleaved timing. Returns the
    row, the keys the chosen column tuned, the timer's name, and the wall seconds of
    each phase ("inputs", "first calls", "timing": what the progress line shows).
    `make(seed)`: the row's compiled input program (`input_programs`), else compiled
    here."""
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    # One program makes a row's inputs from the seed: drawn op by op, each array cost a
    # few compiles of its own (about 13 s of the demo on an H200).
    if make is None:
        make = jax.jit(case.args)
    args = make(0)
    sets = [leaves(args)]
    if rotate and demo_cases.arg_bytes(args) < ROTATE_BELOW_BYTES:
        sets.append(leaves(make(1)))
    jax.block_until_ready(sets)
    phases["inputs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    results: dict[str, Measured] = {}
    programs: dict[str, Any] = {}
    built: dict[str, Built] = {}
    recorder.take()
    for impl in demo_results.FIRST_CALL_ORDER:
        fn = implementations[impl]
        if isinstance(fn, str):  # why it does not exist here
            results[impl] = Measured(NA, note=fn)
            continue
        compiled, results[impl] = first_call(fn, args, built, impl)
        if compiled is not None and shared_with(results[impl]) is None:
            programs[impl] = compiled
    where, backend, tuned = chosen_from(recorder.take())
    phases["first calls"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    times, errors, timer = interleaved(programs, sets, plan)
    phases["timing"] = time.perf_counter() - t0
    for impl, m in results.items():  # a shared program is timed once, for both
        other = shared_with(m)
        if other is not None and other in times:
            times[impl] = times[other]
        elif other is not None and other in errors:
            errors[impl] = errors[other]
    for impl, t in times.items():
        results[impl].time_s = t
    for impl, text in errors.items():  # it compiled and ran once, then failed while timed
        results[impl].status, results[impl].note = status_of(text), text
    row = Row(
        case.name, case.label, case.shape, case.pass_, case.plain_name,
        {i: results[i] for i in demo_results.IMPLS}, where, backend,
    )  # fmt: skip
    return row, tuned, timer, phases


def read_back(
    cases: list[demo_cases.Case], persistent: Any, *, interpret: bool
) -> tuple[str, int, float]:
    """What this run left for the next: a fresh executor over the same persistent
    cache, timing nothing (a first call takes its predicted config untimed), traces
    each row's kerneltune call on abstract inputs (nothing compiles or runs). Returns
    where its configs came from ("persistent 6, shipped 3, ..."), how many keys it
    tuned (none) and its seconds."""
    import dataclasses

    from kerneltune._src.selection.policy import AutotunePolicy, FirstCallBudget

    untimed = dataclasses.replace(AutotunePolicy.from_env(), budget=FirstCallBudget(candidates=0))
    recorder = Recorder()
    executor = demo_executors.chosen(persistent, recorder, interpret=interpret, policy=untimed)
    t0 = time.perf_counter()
    failed = []
    for case in cases:  # rows whose kerneltune call ran in this run
        try:
            jax.eval_shape(case.kerneltune(executor), *jax.eval_shape(case.args, 0))
        except Exception as e:  # one row must not end the demo; it is named below
            failed.append(f"{case.label}: {error_line(e)}")
    where, _, tuned = chosen_from(recorder.take())
    if failed:
        where += f" (could not read back {'; '.join(failed)})"
    return where, len(tuned), time.perf_counter() - t0


def implementations_of(
    case: demo_cases.Case, tokamax: Any, tokamax_note: str, executors: dict[str, Any]
) -> dict[str, Any]:
    """Each column's function for `case`, or the reason it has none (a string)."""
    out: dict[str, Any] = {"plain": case.plain}
    if case.tokamax is None:
        out["tokamax"] = "tokamax has no such op"
    elif tokamax is None:
        out["tokamax"] = f"tokamax {tokamax_note}"
    else:
        out["tokamax"] = case.tokamax(tokamax)
    for impl, ex in executors.items():
        out[impl] = case.kerneltune(ex)
    return out


def _forget_previous(persistent: Any) -> int:
    """Removes from the persistent cache the keys an earlier demo on this device tuned,
    so that this run's first calls tune as on an empty cache. Returns how many."""
    try:
        previous = demo_results.load(persistent.location)
    except (ValueError, OSError):
        return 0
    if previous is None or previous.fingerprint != devices.device_fingerprint():
        return 0
    return sum(bool(persistent.delete(*key)) for key in previous.tuned_keys)


def _budget_text() -> str:
    from kerneltune._src.selection.policy import AutotunePolicy

    budget = AutotunePolicy.from_env().budget
    if budget is None:
        return "else a full search on the first call (KERNELTUNE_FIRST_CALL_CANDIDATES=all)"
    timed = (
        f"a first call timing the heuristic and {budget.candidates} predicted configs, "
        f"{budget.key_s:g} s a key and {budget.process_s:g} s in all"
    )
    if budget.trust_prediction:
        return f"else the config predicted from tuned calls nearby, untimed, else {timed}"
    return f"else {timed}"


def run(args: argparse.Namespace) -> int:
    """The `kerneltune demo` command."""
    from kerneltune._src.cli.cache_commands import _open
    from kerneltune.kernels._common import on_gpu

    start = time.perf_counter()
    gpu = on_gpu()
    device = jax.devices()[0]
    cases = selected(getattr(args, "ops", None), demo_cases.cases(gpu))
    persistent = _open(args)
    # Importing tokamax (2.6 s on an H200) is Python work that overlaps the compiles of
    # the rows' input programs, which let go of Python's lock.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        importing = pool.submit(_tokamax, args)
        t0 = time.perf_counter()
        makers = input_programs(cases)
        inputs_s = time.perf_counter() - t0
        tokamax, tokamax_note = importing.result()
    now = datetime.datetime.now(datetime.UTC)
    say(
        f"kerneltune demo on {device.device_kind} ({device.platform}), jax {jax.__version__}, "
        f"tokamax {tokamax_note}, {now:%Y-%m-%d %H:%M} UTC"
    )
    print(f"persistent cache: {persistent.location}")
    say(
        "Each op against what you would call instead: plain JAX, tokamax (where it has the "
        "op), kerneltune untuned (its heuristic configs) and kerneltune as chosen by the "
        f"default policy (the tables shipped for this GPU model, {_budget_text()})."
    )
    if not gpu:
        print(
            "\nNo GPU: every op runs at tiny sizes, kerneltune's Pallas kernels in the Pallas "
            "interpreter.\nThe timings measure the interpreter and XLA:CPU; they mean nothing "
            "for a GPU.\nA sample of the GPU table, from BENCHMARKS.md, follows this run's."
        )
    forgotten = _forget_previous(persistent)
    if forgotten:
        print(f"(forgot {forgotten} configs an earlier demo tuned, so that first calls tune)")
    print()

    recorder = Recorder()
    executors = {
        "kt_untuned": demo_executors.untuned(interpret=not gpu),
        "kt_chosen": demo_executors.chosen(persistent, recorder, interpret=not gpu),
    }
    plan = GPU_ROUNDS if gpu else CPU_ROUNDS
    print(
        f"[0/{len(cases)}] the rows' input programs: {inputs_s:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    rows, tuned_keys, timers = [], [], set()
    for i, case in enumerate(cases, 1):
        t0 = time.perf_counter()
        fns = implementations_of(case, tokamax, tokamax_note, executors)
        row, tuned, timer, phases = measure_row(
            case, fns, plan, recorder, rotate=gpu, make=makers.get(case.name)
        )
        rows.append(row)
        tuned_keys += tuned
        timers.add(timer)
        elapsed = time.perf_counter() - t0
        split = ", ".join(f"{name} {s:.1f} s" for name, s in phases.items())
        print(
            f"[{i}/{len(cases)}] {case.label}: {elapsed:.1f} s ({split})",
            file=sys.stderr,
            flush=True,
        )

    comparison = Comparison(
        device=str(device.device_kind),
        platform=str(device.platform),
        fingerprint=devices.device_fingerprint(),
        date=f"{now:%Y-%m-%d %H:%M} UTC",
        jax=jax.__version__,
        tokamax=None if tokamax is None else str(getattr(tokamax, "__version__", "?")),
        timer="+".join(sorted(timers)),
        interpreter=not gpu,
        rows=rows,
        tuned_keys=tuned_keys,
    )
    say(
        f"Time per call: median of {plan.rounds} interleaved rounds, {comparison.timer} timer"
        f"{' (device time)' if 'cupti' in timers else ''}; x plain, x tokamax: their time "
        "over kerneltune's as chosen (> 1: kerneltune is faster)."
    )
    print_comparison(comparison)
    where, retuned, seconds = read_back(
        [c for c, r in zip(cases, rows, strict=True) if r.results["kt_chosen"].status == OK],
        persistent,
        interpret=not gpu,
    )
    say(
        "Read back as the next run would (a new executor over the persistent cache, "
        f"tracing only, timing nothing): configs from {where or 'nowhere'}; {retuned} keys "
        f"tuned, {seconds:.1f} s. Keys this run predicted once its first-call budget was "
        "spent are tuned by the next run's first calls, or all at once by `kerneltune "
        "tune` / `kt.autotune`."
    )
    comparison.total_s = time.perf_counter() - start
    try:
        where = demo_results.save(comparison, persistent.location)
        saved = f"Saved to {where}: `kerneltune report --out report.png` plots it."
    except OSError as e:
        saved = f"Could not save the comparison for `kerneltune report`: {error_line(e)}"
    if not gpu:
        print("\nWhat the same table measured on GPUs (BENCHMARKS.md, not this run):")
        header, body = demo_sample.table()
        print_table(header, body)
        for line in demo_sample.footer():
            say(line, "  ")
    print(f"\n{saved}\nTotal {comparison.total_s:.1f} s. BENCHMARKS.md has the full tables.")
    return 0 if all(r.results["kt_chosen"].status == OK for r in rows) else 1
