"""The benchmarks' results: one `Row` per op and shape (or block), seconds per call by
column, printed as one table and written as JSON."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Sequence
from typing import Any

import jax

from benchmarks.harness import on_gpu

COLUMNS = ("plain", "cudnn", "tokamax", "kt_heuristic", "kt_tuned")
HEADER = (
    "op pass shape plain cuDNN tokamax kt_heur kt_tuned backend tuned÷best %copy tune_s"
    " 1st÷best peak÷best"
)
HEADER_CELLS = [c.replace("_", " ") for c in HEADER.split()]


@dataclasses.dataclass
class Row:
    """One op at one shape, or one block: seconds per call by column (None where it
    does not apply or failed: `errors` says which)."""

    op: str
    pass_: str
    shape: str
    times: dict[str, float | None] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(COLUMNS)
    )
    backend: str = "-"
    tune_s: float | None = None
    bytes_moved: int | None = None
    pct_copy: float | None = None
    first_call_s: dict[str, float] = dataclasses.field(default_factory=dict)
    #: The compiled program's memory (arguments, outputs, temporaries) by column.
    peak_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    note: str = ""
    #: The columns whose compiled program is kerneltune tuned's own (timings that
    #: differ between them are noise).
    same_program: list[str] = dataclasses.field(default_factory=list)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def vs_best_other(self) -> float | None:
        """The best other implementation's time ÷ tuned time (> 1: tuned is faster)."""
        others = [t for k, t in self.times.items() if t and k not in ("kt_heuristic", "kt_tuned")]
        tuned = self.times.get("kt_tuned")
        return min(others) / tuned if others and tuned else None

    def _tuned_over_best_other(self, by_column: dict[str, Any]) -> float | None:
        others = [v for k, v in by_column.items() if v and k not in ("kt_heuristic", "kt_tuned")]
        tuned = by_column.get("kt_tuned")
        return tuned / min(others) if others and tuned else None

    @property
    def first_call_vs_best_other(self) -> float | None:
        """Tuned's first call (tuning included) ÷ the quickest other first call (< 1:
        tuned starts sooner)."""
        return self._tuned_over_best_other(self.first_call_s)

    @property
    def peak_vs_best_other(self) -> float | None:
        """Tuned's program memory ÷ the smallest other's (< 1: tuned needs less)."""
        return self._tuned_over_best_other(self.peak_bytes)

    def as_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["pass"] = d.pop("pass_")
        d["tuned_vs_best_other"] = self.vs_best_other
        d["first_call_vs_best_other"] = self.first_call_vs_best_other
        d["peak_vs_best_other"] = self.peak_vs_best_other
        return d


def _us(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e6:.0f}" if t < 0.1 else f"{t * 1e3:.1f}ms"


def cells(r: Row) -> list[str]:
    ratio = r.vs_best_other
    out = [r.op, r.pass_, r.shape] + [_us(r.times.get(c)) for c in COLUMNS]
    out.append(r.backend)
    out.append("-" if ratio is None else f"{ratio:.2f}x")
    out.append("-" if r.pct_copy is None else f"{r.pct_copy:.0f}%")
    out.append("-" if r.tune_s is None else f"{r.tune_s:.1f}")
    for ratio in (r.first_call_vs_best_other, r.peak_vs_best_other):
        out.append("-" if ratio is None else f"{ratio:.2f}x")
    return out


def table(rows: Sequence[Row]) -> str:
    """The results as one text table (times in µs unless marked ms)."""
    lines = [HEADER_CELLS] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER_CELLS))]
    text = [
        "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
        for line in lines
    ]
    text.insert(1, "-" * len(text[0]))
    notes = [f"  {r.op} {r.shape}: {r.note}" for r in rows if r.note]
    notes += [
        f"  {r.op} {r.pass_} {r.shape}: kt tuned compiles to the same program as "
        + ", ".join(c.replace("_", " ") for c in r.same_program)
        for r in rows
        if r.same_program
    ]
    errors = [f"  {r.op} {r.pass_} {r.shape} {k}: {e}" for r in rows for k, e in r.errors.items()]
    return "\n".join(
        text + (["notes:", *notes] if notes else []) + (["errors:", *errors] if errors else [])
    )


def write_json(path: str, rows: Sequence[Row], **meta: Any) -> None:
    device = jax.devices()[0]
    doc = {
        "device": getattr(device, "device_kind", device.platform),
        "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "timer": "cupti" if on_gpu() else "wallclock",
        **meta,
        "rows": [r.as_json() for r in rows],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
