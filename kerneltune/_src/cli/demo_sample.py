"""What the demo's table looks like on a GPU: the table a GPU run of `kerneltune demo`
printed (an H100, empty cache, tokamax installed), as BENCHMARKS.md records it with its
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
        "2026-12-05 (fortieth session): the GPU suite at ac4c6e2, the demo on an H100 and "
        "its smaller MoE rows, `kt.autotune` of the MoE layer in 22.7 s",
        "`kerneltune demo`, empty cache; kt chosen by the default policy (the shipped "
        "table, else the predicted config, else the heuristic)",
    ),
}

HEADER = ["op", "shape", "pass", "plain JAX", "tokamax", "kt untuned", "kt chosen", "GPU [src]"]

#: (op, shape, pass, plain, tokamax, kt untuned (heuristic), kt chosen, GPU, source).
ROWS = (
    ("ragged_dot", "8192x4096->14336 E8", "fwd",
     "20.8 ms", "10.5 ms", "4.23 ms", "3.46 ms", "H100", 1),
    ("MoE layer", "T4096 D4096 F14336 E8 top-2", "train",
     "74 ms", "34.4 ms", "15.9 ms", "15.7 ms", "H100", 1),
    ("attention", "B4 T2048 N32 H64 causal", "fwd+bwd",
     "780 us", "854 us", "779 us", "779 us", "H100", 1),
    ("attention (window)", "B1 T16384 N16/4 H128 window 4096", "fwd+bwd",
     "3.24 ms", "13.4 ms", "3.25 ms", "3.25 ms", "H100", 1),
    ("loss head", "16384x2048->128256", "fwd+bwd",
     "38.9 ms", "93.2 ms", "38.5 ms", "38.5 ms", "H100", 1),
    ("GLU (SwiGLU)", "16384x2048->5632", "fwd+bwd",
     "19.5 ms", "18.7 ms", "17.9 ms", "17.9 ms", "H100", 1),
    ("layer_norm", "4096x16384", "fwd", "384 us", "384 us", "385 us", "298 us", "H100", 1),
    ("matmul", "64x8192x8192", "fwd", "175 us", "-", "175 us", "175 us", "H100", 1),
    ("softmax", "4096x32768", "fwd", "387 us", "-", "352 us", "261 us", "H100", 1),
)  # fmt: skip

#: First calls and peak memory of the same run (the demo's second table).
FIRST_CALLS_AND_PEAKS = (
    "MoE layer [1]: first call 8.0 s plain, 6.1 s tokamax, 4.0 s kt chosen; peak 10.19, "
    "5.94, 5.66 GiB.",
    "ragged_dot [1]: first call 2.4 s plain, 1.1 s tokamax, 0.66 s kt chosen.",
    "All rows [1]: first calls 16.5 s kerneltune, 19.2 s plain JAX; the demo 71.3 s in all "
    "(a host that had run the demo before).",
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
