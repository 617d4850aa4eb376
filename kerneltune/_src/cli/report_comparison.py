"""The last `kerneltune demo`'s comparison as a figure (for `kerneltune report --out
FILE.png`) and as an HTML table.

Two panels share the rows: each implementation's speed over plain JAX (plain's time
÷ its time, on a log scale; > 1 is faster), and its peak memory ÷ plain JAX's. Plain JAX
is the line at 1, and each bar runs from it (right: faster, or more memory); a missing
bar says why in its place ("n/a", "failed", "oom").
"""

from __future__ import annotations

import html
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI parser imports `report_command`, which imports this lazily
    from kerneltune._src.caching.cache_entry import CacheEntry
    from kerneltune._src.cli.demo_results import Comparison, Row

#: The bars of a row, bottom to top within its group, and their colours.
BARS = (("kt_chosen", "kerneltune as chosen", "tab:orange"),
        ("kt_untuned", "kerneltune untuned", "#f5c08a"),
        ("tokamax", "tokamax", "tab:gray"))  # fmt: skip
BAR_HEIGHT = 0.26
#: Inches of figure height per row of the comparison.
ROW_INCHES = 0.62


def height(comparison: Comparison) -> float:
    """The comparison's figure height in inches."""
    return 1.6 + ROW_INCHES * len(comparison.rows)


def _ratio(row: Row, impl: str, what: str) -> float | None:
    """plain ÷ impl for time ("time"), impl ÷ plain for memory ("peak")."""
    plain, m = row.results.get("plain"), row.results.get(impl)
    if plain is None or m is None or m.status != "ok":
        return None
    if what == "time":
        return plain.time_s / m.time_s if plain.time_s and m.time_s else None
    return m.peak_bytes / plain.peak_bytes if plain.peak_bytes and m.peak_bytes else None


def _label(row: Row) -> str:
    from kerneltune._src.tuning.report import format_seconds

    plain = row.results.get("plain")
    t = format_seconds(plain.time_s if plain is not None else None, "n/a")
    return f"{row.label} ({row.pass_})\n{row.shape}\nplain JAX {t}"


def _panel(ax: Any, comparison: Comparison, what: str) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    rows = comparison.rows
    for y, row in enumerate(rows):
        for j, (impl, _, colour) in enumerate(BARS):
            pos = y + (j - 1) * BAR_HEIGHT
            value = _ratio(row, impl, what)
            if value is None:
                m = row.results.get(impl)
                why = "n/a" if m is None or m.status == "ok" else m.status
                ax.text(1.0, pos, f"  {why}", va="center", fontsize=6, color="dimgray")
                continue
            ax.barh(pos, value - 1.0, height=BAR_HEIGHT, left=1.0, color=colour)
            ax.text(value, pos, f" {value:.2f}x", va="center", fontsize=6)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=7)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    if what == "time":
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yticklabels([_label(r) for r in rows], fontsize=6)
        ax.set_xlabel("speed over plain JAX (plain's time ÷ its time; > 1 is faster)", fontsize=7)
    else:
        ax.set_yticklabels([])
        ax.set_xlabel("peak memory ÷ plain JAX's (< 1 is less)", fontsize=7)
    ax.margins(x=0.15)


def draw(fig: Any, comparison: Comparison) -> None:
    """Draws the comparison on `fig` (a matplotlib figure or subfigure)."""
    from matplotlib.patches import Patch

    speed, memory = fig.subplots(1, 2, width_ratios=(3, 2))
    _panel(speed, comparison, "time")
    _panel(memory, comparison, "peak")
    handles = [Patch(color=colour, label=name) for _, name, colour in reversed(BARS)]
    handles.append(Patch(color="black", label="plain JAX (1x)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=7)
    where = (
        "\nCPU: tiny sizes, the Pallas interpreter and XLA:CPU; these timings mean nothing "
        "for a GPU"
        if comparison.interpreter
        else ""
    )
    fig.suptitle(
        f"kerneltune demo on {comparison.device}, {comparison.date}: each op against plain JAX "
        f"({comparison.timer} timer){where}",
        fontsize=9,
    )


def html_table(comparison: Comparison) -> str:
    """The comparison's timing table as an HTML fragment."""
    from kerneltune._src.cli.demo_results import summary, timing_table

    esc = html.escape
    header, body = timing_table(comparison.rows)
    parts = [
        f"<h2>The last demo: {esc(comparison.device)}, {esc(comparison.date)}</h2><table><tr>",
        "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>",
    ]
    for cells in body:
        parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    parts.append(f"</table><p>{esc(summary(comparison.rows, comparison.interpreter))}</p>")
    return "\n".join(parts)


def load(location: str) -> Comparison | None:
    """The last demo's comparison beside the cache at `location`, if any (a file that
    cannot be read is said on stderr and left out)."""
    from kerneltune._src.cli import demo_results

    try:
        return demo_results.load(location)
    except (ValueError, OSError) as e:
        print(f"kerneltune: the last demo's comparison cannot be read: {e}", file=sys.stderr)
        return None


def contents(entries: Sequence[CacheEntry], comparison: Comparison | None) -> str:
    """What a written report holds: "the demo's comparison and 3 keys"."""
    parts = ["the demo's comparison"] if comparison is not None else []
    if entries or comparison is None:
        parts.append(f"{len(entries)} keys")
    return " and ".join(parts)
