"""`kerneltune report`: the last `kerneltune demo`'s comparison (each op against plain
JAX and tokamax) and every tuned key in the persistent cache as tables, and both as a
plot (PNG through matplotlib, or a self-contained HTML page).

matplotlib is an optional extra (`pip install 'kerneltune[report]'`); without it the
table is printed, HTML pages still work, and a PNG request says what to install.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing this module must stay cheap: the CLI parser imports it.
    from kerneltune._src.caching.cache_entry import CacheEntry
    from kerneltune._src.cli.demo_results import Comparison

#: At most this many candidates are drawn per key (the fastest); the rest are counted.
MAX_BARS = 24
#: At most this many keys are drawn in one PNG.
MAX_PANELS = 24
HINT = "Plots need matplotlib: pip install 'kerneltune[report]' (HTML reports work without it)."


@dataclasses.dataclass(frozen=True)
class PlotBar:
    """One candidate of a tuned key as the report shows it (a bar of the plot)."""

    label: str
    time_s: float | None
    status: str
    error: str | None
    winner: bool
    heuristic: bool


def format_cfg(cfg: Any) -> str:
    """`bm=128 bn=64 ...` for a config's field dict (None fields left out)."""
    if isinstance(cfg, dict):
        return " ".join(f"{k}={v}" for k, v in cfg.items() if v is not None)
    return str(cfg)


def candidates_of(entry: CacheEntry) -> list[PlotBar]:
    """The entry's candidates, fastest first, failures last."""
    out = []
    for c in entry.candidates:
        cfg = c.get("cfg")
        time_s = c.get("time_s")
        status = str(c.get("status", "ok"))
        ok = status == "ok" and isinstance(time_s, (int, float)) and math.isfinite(time_s)
        out.append(
            PlotBar(
                label=format_cfg(cfg),
                time_s=float(time_s) if ok and time_s is not None else None,
                status=status,
                error=c.get("error"),
                winner=cfg == entry.cfg,
                heuristic=entry.heuristic_cfg is not None and cfg == entry.heuristic_cfg,
            )
        )
    out.sort(key=lambda c: (c.time_s is None, c.time_s or 0.0))
    return out


def short_signature(signature: str) -> str:
    """A call signature made short enough for a table or a plot title: repeated
    arguments counted, long floats rounded.

    Example:
      >>> short_signature("f32[8,64], f32[8,64], f32[2], causal=True, sm_scale=0.17677669529663687")
      'f32[8,64]×2, f32[2], causal=True, sm_scale=0.1768'
    """
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(signature):
        depth += 1 if ch in "[(" else (-1 if ch in "])" else 0)
        if ch == "," and depth == 0:
            parts.append(signature[start:i].strip())
            start = i + 1
    parts.append(signature[start:].strip())
    out: list[list[Any]] = []
    for part in filter(None, parts):
        name, eq, value = part.partition("=")
        if eq:
            try:
                number = float(value)
                if "." in value and len(value) > 8:
                    part = f"{name}={number:.4g}"
            except ValueError:
                pass
        if out and out[-1][0] == part:
            out[-1][1] += 1
        else:
            out.append([part, 1])
    return ", ".join(p if n == 1 else f"{p}×{n}" for p, n in out)


def title_of(entry: CacheEntry) -> str:
    return f"{entry.op_id}  {short_signature(entry.signature) if entry.signature else entry.call_key[:12]}"


# --- the table ---------------------------------------------------------------------


def table_rows(entries: Sequence[CacheEntry]) -> list[list[str]]:
    from kerneltune._src.cli.cache_commands import format_time

    rows = []
    for e in entries:
        cands = candidates_of(e)
        evaluated = [c for c in cands if c.status != "pruned"]
        failed = [c for c in evaluated if c.time_s is None]
        speedup = f"{e.speedup:.2f}x" if e.speedup else "-"
        rows.append(
            [
                e.op_id,
                short_signature(e.signature) if e.signature else e.call_key[:12],
                e.dev,
                e.timer or "-",
                f"{len(evaluated)}/{len(failed)}",
                format_time(e.heuristic_time_s),
                format_time(e.best_time_s),
                speedup,
                format_cfg(e.cfg),
            ]
        )
    return rows


TABLE_HEADER = [
    "op",
    "shapes",
    "device",
    "timer",
    "tried/failed",
    "heuristic",
    "best",
    "speedup",
    "winner",
]


def failure_lines(entries: Sequence[CacheEntry]) -> list[str]:
    lines = []
    for e in entries:
        for c in candidates_of(e):
            if c.time_s is None and c.status != "pruned":
                lines.append(f"{title_of(e)}: {c.label}: {c.status}: {c.error or ''}".rstrip(": "))
    return lines


# --- PNG -----------------------------------------------------------------------------


def write_png(
    entries: Sequence[CacheEntry], path: str, comparison: Comparison | None = None
) -> int:
    """Draws the last demo's `comparison` (when given) on top, then one panel per key: a
    bar per candidate (fastest at the top), the winner in orange, the heuristic config
    hatched, failures named under the bars. Returns the number of key panels drawn."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from kerneltune._src.cli import report_comparison

    drawn = [e for e in entries if any(c.time_s is not None for c in candidates_of(e))][:MAX_PANELS]
    if not drawn and comparison is None:
        raise ValueError("no entry has candidate timings to plot (entries imported without them?)")
    cols = 1 if len(drawn) <= 1 else 2
    rows = math.ceil(len(drawn) / cols)
    heights = [min(MAX_BARS, len(candidates_of(e))) * 0.22 + 1.4 for e in drawn]
    panels_h = max(heights, default=0.0) * rows
    top_h = report_comparison.height(comparison) if comparison is not None else 0.0
    fig = plt.figure(figsize=(8.5 * max(cols, 2 if comparison else 1), top_h + panels_h),
                     layout="constrained")  # fmt: skip
    if comparison is not None and drawn:
        parts: Any = fig.subfigures(2, 1, height_ratios=(top_h, panels_h))
        top, bottom = parts[0], parts[1]
        report_comparison.draw(top, comparison)
    elif comparison is not None:
        report_comparison.draw(fig, comparison)
        bottom = None
    else:
        bottom = fig
    if bottom is not None:
        axes = bottom.subplots(rows, cols, squeeze=False)
        for ax in axes.flat[len(drawn) :]:
            ax.axis("off")
        for ax, entry in zip(axes.flat, drawn):
            _panel(ax, entry)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(drawn)


def _panel(ax: Any, entry: CacheEntry) -> None:
    cands = candidates_of(entry)
    ok = [c for c in cands if c.time_s is not None][:MAX_BARS]
    times = [c.time_s for c in ok if c.time_s is not None]
    failed = [c for c in cands if c.time_s is None and c.status != "pruned"]
    scale, unit = _unit(max(times))
    ys = list(range(len(ok)))
    colors = ["tab:orange" if c.winner else "tab:blue" for c in ok]
    bars = ax.barh(ys, [t * scale for t in times], color=colors)
    for bar, c, t in zip(bars, ok, times):
        if c.heuristic:
            bar.set_hatch("//")
            bar.set_edgecolor("black")
        ax.annotate(
            f" {t * scale:.3g}",
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            va="center",
            fontsize=6,
        )
    ax.margins(x=0.12)
    ax.set_yticks(ys)
    ax.set_yticklabels([c.label for c in ok], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel(f"time per call ({unit}, {entry.timer or '?'} timer)", fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    speed = f", {entry.speedup:.2f}x over heuristic" if entry.speedup else ""
    ax.set_title(f"{title_of(entry)}\n{entry.dev}{speed}", fontsize=8)
    notes = []
    hidden = len([c for c in cands if c.time_s is not None]) - len(ok)
    if hidden > 0:
        notes.append(f"{hidden} slower candidates not shown")
    if failed:
        names = "; ".join(f"{c.label} ({c.status})" for c in failed[:3])
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        notes.append(f"failed: {names}{more}")
    notes.append("orange: winner; hatched: heuristic")
    ax.text(
        0.99,
        0.02,
        "\n".join(notes),
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=6,
        bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
    )


def _unit(max_s: float) -> tuple[float, str]:
    if max_s >= 1.0:
        return 1.0, "s"
    if max_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"


# --- HTML ----------------------------------------------------------------------------


def html_page(entries: Sequence[CacheEntry], comparison: Comparison | None = None) -> str:
    """A self-contained page: the last demo's comparison (when given), the summary
    table, then per key a bar per candidate (CSS widths, no scripts, no matplotlib
    needed)."""
    esc = html.escape
    parts = [
        "<!doctype html><meta charset='utf-8'><title>kerneltune report</title><style>",
        "body{font:13px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}",
        "td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #ddd}",
        ".bar{background:#4c78a8;height:12px}.win .bar{background:#f58518}",
        ".heur .bar{background-image:repeating-linear-gradient(45deg,transparent 0 3px,#0005 3px 5px)}",
        ".fail{color:#b00}code{font-size:12px}</style><h1>kerneltune report</h1>",
    ]
    if comparison is not None:
        from kerneltune._src.cli.report_comparison import html_table

        parts.append(html_table(comparison))
    if not entries:
        return "\n".join(parts) + "\n"
    parts += [
        "<h2>Tuned keys</h2>",
        "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in TABLE_HEADER) + "</tr>",
    ]
    for row in table_rows(entries):
        parts.append("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>")
    parts.append("</table><p>Orange: the winner; hatched: the heuristic config.</p>")
    from kerneltune._src.cli.cache_commands import format_time

    for entry in entries:
        cands = candidates_of(entry)
        ok = [c for c in cands if c.time_s is not None]
        parts.append(
            f"<h2><code>{esc(title_of(entry))}</code></h2><p>{esc(entry.dev)}, "
            f"timer {esc(entry.timer or '?')}, {len(ok)} timed</p><table>"
        )
        top = max((c.time_s for c in ok), default=0.0) or 1.0  # type: ignore[type-var]
        for c in cands:
            cls = " ".join(n for n, on in (("win", c.winner), ("heur", c.heuristic)) if on)
            if c.time_s is None:
                if c.status != "pruned":
                    parts.append(
                        f"<tr class='fail'><td><code>{esc(c.label)}</code></td><td>{esc(c.status)}</td>"
                        f"<td>{esc(c.error or '')}</td></tr>"
                    )
                continue
            width = max(1.0, 400.0 * c.time_s / top)
            parts.append(
                f"<tr class='{cls}'><td><code>{esc(c.label)}</code></td>"
                f"<td>{esc(format_time(c.time_s))}</td>"
                f"<td><div class='bar' style='width:{width:.0f}px'></div></td></tr>"
            )
        parts.append("</table>")
    return "\n".join(parts) + "\n"


# --- the command ---------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`kerneltune report`'s arguments."""
    parser.add_argument(
        "--op",
        help='only this op\'s tuned keys (no demo comparison): "matmul" (any version) or "matmul@v1"',
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="also plot the last demo's comparison and every candidate's time: FILE.png (.svg, "
        ".pdf; needs matplotlib: pip install 'kerneltune[report]') or FILE.html",
    )


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    """The `kerneltune report [--op OP] [--out FILE]` command."""
    from kerneltune._src.cli import report_comparison
    from kerneltune._src.cli.cache_commands import _entries, _open, print_table
    from kerneltune._src.cli.errors import CommandError

    cache = _open(args)
    op = getattr(args, "op", None)
    entries = [e for e in _entries(cache, op) if e.candidates or e.best_time_s]
    comparison = None if op else report_comparison.load(cache.location)
    out = getattr(args, "out", None)
    if not entries and comparison is None:
        what = f" for op {op!r}" if op else ""
        print(f"No tuned entries{what} in {cache.location}. Run `kerneltune demo` to make some.")
        return 0
    if comparison is not None:
        from kerneltune._src.cli.demo_results import print_comparison

        print(f"The last `kerneltune demo` ({comparison.device}, {comparison.date}):")
        print_comparison(comparison)
        if entries:
            print("\nThe tuned keys in the cache:")
    if entries:
        print_table(TABLE_HEADER, table_rows(entries))
    failures = failure_lines(entries)
    if failures:
        print("\nFailed candidates:")
        for line in failures:
            print(f"  {line}")
    if out is None:
        if not _have_matplotlib():
            print(f"\n{HINT}")
        return 0
    ext = os.path.splitext(out)[1].lower()
    if ext in (".html", ".htm"):
        try:
            with open(out, "w", encoding="utf-8") as f:
                f.write(html_page(entries, comparison))
        except OSError as e:
            raise CommandError(f"cannot write --out {out}: {e.strerror or e}.") from None
        print(f"\nWrote {out} ({report_comparison.contents(entries, comparison)}).")
        return 0
    if ext not in (".png", ".svg", ".pdf"):
        raise CommandError(f"--out must end in .png, .svg, .pdf or .html, got {out!r}.")
    if not _have_matplotlib():
        print(f"\n{HINT}")
        return 1
    try:
        drawn = write_png(entries, out, comparison)
    except ValueError as e:
        raise CommandError(str(e)) from None
    except OSError as e:
        raise CommandError(f"cannot write --out {out}: {e.strerror or e}.") from None
    more = f", the first {drawn} of {len(entries)}" if drawn < len(entries) else ""
    print(f"\nWrote {out} ({report_comparison.contents(entries[:drawn], comparison)}{more}).")
    return 0
