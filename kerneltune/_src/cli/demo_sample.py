"""What the demo's table looks like on a GPU: the table a GPU run of `kerneltune demo`
printed (an H200, empty cache, tokamax installed), as BENCHMARKS.md records it with its
date, command and section. The CPU demo prints it after its own table, whose timings
mean nothing for a GPU. Nothing here is measured by the demo; a GPU run of the demo
measures every row itself.
"""

from __future__ import annotations

#: BENCHMARKS.md's sections the rows come from (its headings, verbatim), with how the
#: `kt chosen` column was chosen. bf16, CUPTI device time, medians of 5 interleaved
#: rounds, jax 0.11.2, tokamax 0.0.17.
SOURCES = {
    1: (
        "2026-11-27 (seventeenth session): the demo and the examples on an H200 (issue 47)",
        "`kerneltune demo`, empty cache; kt chosen by the default policy (the shipped "
        "table, else the heuristic)",
    ),
}

HEADER = ["op", "shape", "pass", "plain JAX", "tokamax", "kt untuned", "kt chosen", "GPU [src]"]

#: (op, shape, pass, plain, tokamax, kt untuned (heuristic), kt chosen, GPU, source).
ROWS = (
    ("ragged_dot", "16384x4096->14336 E8", "fwd",
     "42.2 ms", "15.3 ms", "7.57 ms", "7.01 ms", "H200", 1),
    ("MoE layer", "T8192 D4096 F14336 E8 top-2", "train",
     "142 ms", "55.9 ms", "25 ms", "25.1 ms", "H200", 1),
    ("attention", "B4 T2048 N32 H64 causal", "fwd+bwd",
     "761 us", "864 us", "761 us", "761 us", "H200", 1),
    ("attention (window)", "B1 T16384 N16/4 H128 window 4096", "fwd+bwd",
     "3.21 ms", "13.6 ms", "3.21 ms", "3.21 ms", "H200", 1),
    ("loss head", "16384x2048->128256", "fwd+bwd",
     "39.2 ms", "85.6 ms", "38.8 ms", "37.9 ms", "H200", 1),
    ("GLU (SwiGLU)", "16384x2048->5632", "fwd+bwd",
     "19.8 ms", "19.6 ms", "18.9 ms", "18.6 ms", "H200", 1),
    ("layer_norm", "4096x16384", "fwd", "302 us", "302 us", "302 us", "221 us", "H200", 1),
    ("matmul", "64x8192x8192", "fwd", "121 us", "-", "121 us", "122 us", "H200", 1),
    ("softmax", "4096x32768", "fwd", "314 us", "-", "305 us", "227 us", "H200", 1),
)  # fmt: skip

#: First calls and peak memory of the same run (the demo's second table).
FIRST_CALLS_AND_PEAKS = (
    "MoE layer [1]: first call 12.8 s plain, 6.0 s tokamax, 5.6 s kt chosen; peak 14.25, "
    "6.38, 6.06 GiB.",
    "ragged_dot [1]: first call 3.7 s plain, 0.75 s tokamax, 0.87 s kt chosen.",
    "All rows [1]: first calls 16.9 s kerneltune, 24.7 s plain JAX; the demo 101 s in all.",
)


def table() -> tuple[list[str], list[list[str]]]:
    """The sample as a header and rows of cells."""
    body = [[*row[:7], f"{row[7]} [{row[8]}]"] for row in ROWS]
    return list(HEADER), body


def footer() -> list[str]:
    """The lines under the table: first calls, peaks, and each source."""
    lines = list(FIRST_CALLS_AND_PEAKS)
    lines += [f'[{n}] BENCHMARKS.md, "{heading}": {how}.' for n, (heading, how) in SOURCES.items()]
    return lines
