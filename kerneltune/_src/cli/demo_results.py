"""What `kerneltune demo` measured: one `Row` per op, the run's `Comparison`, its two
tables and its one-line summary, and the file beside the persistent cache that
`kerneltune report` reads it back from."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Sequence
from typing import Any

from kerneltune._src.caching import storage
from kerneltune._src.cli.cache_commands import print_table
from kerneltune._src.cli.demo_measure import OK, Measured, shared_with
from kerneltune._src.core import files
from kerneltune._src.tuning.report import format_seconds

#: The implementations of every row, in table order, and their column headings.
IMPLS = ("plain", "tokamax", "kt_untuned", "kt_chosen")
HEADINGS = {
    "plain": "plain JAX",
    "tokamax": "tokamax",
    "kt_untuned": "kt untuned",
    "kt_chosen": "kt chosen",
}
#: First calls run in this order: a later one may reuse XLA's autotuning of an earlier
#: one's matmuls in the process, which favours plain JAX's figure, not kerneltune's.
FIRST_CALL_ORDER = ("kt_chosen", "kt_untuned", "tokamax", "plain")
#: kerneltune's time within this share of the best other's counts as level: the
#: spread of one program timed twice on these GPUs (BENCHMARKS.md: up to 4%).
LEVEL = 0.05
#: The demo's tables and prose fit a terminal this wide (the summary is one line).
TABLE_WIDTH = 120
#: The file `kerneltune demo` writes at the top of the persistent cache's location.
FILE = "demo-comparison.json"
KIND = "kerneltune.demo_comparison"


@dataclasses.dataclass
class Row:
    """One op at one shape: each implementation's measurement, and where kerneltune's
    chosen configs came from (`chosen_from`) with their backends."""

    name: str
    label: str
    shape: str
    pass_: str
    plain_name: str
    results: dict[str, Measured]
    chosen_from: str = ""
    chosen_backend: str = ""

    def time(self, impl: str) -> float | None:
        m = self.results.get(impl)
        return m.time_s if m is not None and m.status == OK else None

    def ratio(self, impl: str) -> float | None:
        """`impl`'s time over kerneltune as chosen (> 1: kerneltune is faster)."""
        other, ours = self.time(impl), self.time("kt_chosen")
        return other / ours if other and ours else None

    def best_other(self) -> tuple[str, float] | None:
        """The faster of plain JAX and tokamax, where either was timed."""
        timed = [(i, t) for i in ("plain", "tokamax") if (t := self.time(i)) is not None]
        return min(timed, key=lambda it: it[1]) if timed else None

    def verdict(self) -> tuple[str, float] | None:
        """("faster" | "level" | "slower", best other's time ÷ kerneltune's)."""
        best, ours = self.best_other(), self.time("kt_chosen")
        if best is None or not ours:
            return None
        ratio = best[1] / ours
        word = "faster" if ratio >= 1 + LEVEL else "slower" if ratio <= 1 - LEVEL else "level"
        return word, ratio


@dataclasses.dataclass
class Comparison:
    """One run of the demo."""

    device: str
    platform: str
    fingerprint: str
    date: str
    jax: str
    tokamax: str | None
    timer: str
    interpreter: bool
    rows: list[Row]
    total_s: float = 0.0
    #: (device, op id, call key) of every key the chosen column tuned.
    tuned_keys: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["kind"], doc["schema"] = KIND, 1
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> Comparison:
        """Raises ValueError for a document that is not a demo comparison."""
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            raise ValueError(f"not a kerneltune demo comparison (expected kind {KIND!r})")
        try:
            fields = {f.name: doc[f.name] for f in dataclasses.fields(cls)}
            fields["rows"] = [
                Row(**{**r, "results": {k: Measured(**m) for k, m in r["results"].items()}})
                for r in doc["rows"]
            ]
            fields["tuned_keys"] = [tuple(k) for k in doc["tuned_keys"]]
            return cls(**fields)
        except (KeyError, TypeError) as e:
            raise ValueError(f"a malformed demo comparison: {type(e).__name__}: {e}") from None


# --- the file --------------------------------------------------------------------------


def location(cache_location: str) -> str:
    """Where the demo's comparison lives for a persistent cache at `cache_location`."""
    return storage.join(cache_location, FILE)


def save(comparison: Comparison, cache_location: str) -> str:
    """Writes the comparison beside the cache (atomically where local); returns where."""
    where = location(cache_location)
    data = json.dumps(comparison.to_json(), indent=1, allow_nan=False).encode()
    if "://" in where and not where.startswith("file://"):
        import fsspec

        fs, path = fsspec.core.url_to_fs(where)
        fs.pipe_file(path, data)
    else:
        files.write_atomic(where.removeprefix("file://"), data)
    return where


def load(cache_location: str) -> Comparison | None:
    """The last demo's comparison for this cache, or None where there is none.

    Raises:
      ValueError: the file is there but is not a demo comparison.
    """
    try:
        doc = files.read_json_url(location(cache_location))
    except FileNotFoundError:
        return None
    return Comparison.from_json(doc)


# --- the tables --------------------------------------------------------------------------


def _time_cell(m: Measured | None) -> str:
    if m is None:
        return "n/a"
    return format_seconds(m.time_s) if m.status == OK else m.status


def _ratio_cell(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "-"


def timing_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """Time per call of each implementation, and the ratios of the peers' times to
    kerneltune's as chosen (> 1: kerneltune is faster)."""
    header = ["op", "shape", "pass", *(HEADINGS[i] for i in IMPLS), "x plain", "x tokamax"]
    body = [
        [
            r.label,
            r.shape,
            r.pass_,
            *(_time_cell(r.results.get(i)) for i in IMPLS),
            _ratio_cell(r.ratio("plain")),
            _ratio_cell(r.ratio("tokamax")),
        ]
        for r in rows
    ]
    return header, body


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def first_call_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """Each implementation's first call and peak memory, and what kerneltune chose."""
    short = {"plain": "plain", "tokamax": "tokamax", "kt_untuned": "untuned", "kt_chosen": "chosen"}
    header = [
        "op",
        *(f"1st call {short[i]}" if i == "plain" else short[i] for i in IMPLS),
        *(f"peak {short[i]}" if i == "plain" else short[i] for i in IMPLS),
        "kt chosen: from, backend",
    ]
    body = []
    for r in rows:
        firsts, peaks = [], []
        for i in IMPLS:
            m = r.results.get(i)
            ok = m is not None and m.first_call_s is not None
            firsts.append(format_seconds(m.first_call_s) if ok else "-")  # type: ignore[union-attr]
            peaks.append(_gib(m.peak_bytes) if ok else "-")  # type: ignore[union-attr]
        how = ", ".join(x for x in (r.chosen_from, r.chosen_backend) if x) or "-"
        body.append([r.label, *firsts, *peaks, how])
    return header, body


def notes(rows: Sequence[Row]) -> list[str]:
    """Why an implementation was not timed, one line per reason (with the rows it
    holds for)."""
    reasons: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        for i in IMPLS:
            m = r.results.get(i)
            if m is not None and m.status != OK:
                reasons.setdefault((HEADINGS[i], m.status, m.note), []).append(r.label)
    return [
        f"{impl}: {status}{': ' + note if note else ''} ({', '.join(labels)})"
        for (impl, status, note), labels in reasons.items()
    ]


def shared_programs(rows: Sequence[Row]) -> list[str]:
    """One line per pair of implementations that ran one compiled program (`first_call`
    found it already built), with the rows it holds for."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for i in IMPLS:
            m = r.results.get(i)
            other = None if m is None else shared_with(m)
            if other is not None:
                pairs.setdefault((HEADINGS[i], HEADINGS.get(other, other)), []).append(r.label)
    return [
        f"{impl} lowered to the same program as {other}, which was compiled and timed once; "
        f"{impl}'s first call is its own tracing plus that compile and first run "
        f"({', '.join(labels)})."
        for (impl, other), labels in pairs.items()
    ]


def summary(rows: Sequence[Row], interpreter: bool = False) -> str:
    """One line: where kerneltune as chosen is faster than the best of plain JAX and
    tokamax, where it is level with it, where slower, and the first calls' walls."""
    groups: dict[str, list[str]] = {"faster": [], "level": [], "slower": []}
    failed = []
    for r in rows:
        v = r.verdict()
        if v is None:
            if r.time("kt_chosen") is None:
                failed.append(r.label)
            continue
        groups[v[0]].append(f"{r.label} ({v[1]:.2f}x)")
    parts = [f"{word} on {', '.join(names)}" for word, names in groups.items() if names]
    if failed:
        parts.append(f"not timed on {', '.join(failed)}")
    firsts = {
        i: sum(m.first_call_s or 0.0 for r in rows if (m := r.results.get(i)) is not None)
        for i in ("plain", "kt_chosen")
    }
    where = " (CPU: interpreter timings, meaningless for a GPU)" if interpreter else ""
    return (
        f"Summary{where}: kerneltune as chosen, against the faster of plain JAX and tokamax "
        f"(level: within {LEVEL:.0%}): {'; '.join(parts) or 'nothing timed'}. First calls: "
        f"kerneltune {firsts['kt_chosen']:.1f} s in all, plain JAX {firsts['plain']:.1f} s."
    )


# --- printing ----------------------------------------------------------------------------


def say(text: str, indent: str = "") -> None:
    """Prose, wrapped to the tables' width."""
    print(textwrap.fill(text, TABLE_WIDTH, initial_indent=indent, subsequent_indent=indent))


def print_comparison(c: Comparison) -> None:
    """The two tables, the reasons for what was not timed, and the summary (the demo's
    output, and `kerneltune report`'s after it)."""
    print_table(*timing_table(c.rows))
    reasons = notes(c.rows)
    if reasons:
        print("\nNot timed:")
        for line in reasons:
            say(line, "  ")
    print()
    say(
        "First call (wall: tracing, kerneltune's tuning, compiling, one run; in the order "
        f"{', '.join(HEADINGS[i] for i in FIRST_CALL_ORDER)}, so a later one may reuse XLA's "
        "autotuning of an earlier one's matmuls) and peak memory (XLA's plan of the compiled "
        "program: arguments, outputs, temporaries):"
    )
    print_table(*first_call_table(c.rows))
    shared = shared_programs(c.rows)
    if shared:
        print()
    for line in shared:
        say(line)
    print()
    say(f"plain JAX is, per op: {'; '.join(f'{r.label}: {r.plain_name}' for r in c.rows)}.")
    print(summary(c.rows, c.interpreter))
