"""What the demo's table looks like on a GPU: figures copied from BENCHMARKS.md at the
demo's GPU shapes (`demo_cases.GPU_SIZES`), each with its GPU, date and section. The CPU
demo prints them after its own table, whose timings mean nothing for a GPU.

The `kt tuned` column is BENCHMARKS.md's: tuned from an empty cache with the budget a
key its section names, which is not the demo's first-call budget except where the
section says so ([3]). Nothing here is measured by the demo; a GPU run of the demo
measures every row itself.
"""

from __future__ import annotations

#: BENCHMARKS.md's sections the rows come from (its headings, verbatim), with how its
#: `kt tuned` column was tuned. All: bf16, CUPTI device time, medians of interleaved
#: rounds, jax 0.11.2, tokamax 0.0.17.
SOURCES = {
    1: (
        "2026-11-25 (sixth session): the grouped matmul, the loss head and the gated MLP",
        "its `ragged_dot` tables; kt tuned with 10 s a key (the MoE layer: 8 s)",
    ),
    2: (
        "The bundled ops and two model blocks against what JAX users already have",
        "2026-11-23; kt tuned with 3 s a key; plain attention is cuDNN's column",
    ),
    3: (
        "2026-11-27 (sixteenth session): attention variants at long context (issue 44)",
        "kt as the default policy chose it (its first-call budget); plain is cuDNN",
    ),
    4: (
        "2026-11-26 (tenth session): norms in a training step, the H200 (issues 27, 29)",
        "the loss head and GLU table; plain has bf16 logits; kt tuned with 5 s a key",
    ),
    5: (
        "2026-11-26 (fourteenth session): the gated linear unit at the GPU's power cap (issue 29)",
        "`loss_head_gpu --ops glu --rounds 11`; kt tuned with 5 s a key",
    ),
}

HEADER = ["op", "shape", "pass", "plain JAX", "tokamax", "kt untuned", "kt tuned", "GPU [src]"]

#: (op, shape, pass, plain, tokamax, kt untuned (heuristic), kt tuned, GPU, source).
ROWS = (
    ("ragged_dot", "16384x4096->14336 E8", "fwd",
     "19067 us", "6609 us", "3518 us", "3539 us", "H100", 1),
    ("MoE layer", "T8192 D4096 F14336 E8 top-2", "train",
     "146.4 ms", "69.44 ms", "27.05 ms", "28.65 ms", "H100", 1),
    ("attention", "B4 T2048 N32 H64 causal", "fwd+bwd",
     "784 us", "852 us", "779 us", "780 us", "H100", 2),
    ("attention (window)", "B1 T16384 N16/4 H128 window 4096", "fwd+bwd",
     "3.33 ms", "13.52 ms", "-", "3.30 ms", "H200", 3),
    ("loss head", "16384x2048->128256", "fwd+bwd",
     "45.51 ms", "108.59 ms", "44.29 ms", "43.64 ms", "H200", 4),
    ("GLU (SwiGLU)", "16384x2048->5632", "fwd+bwd",
     "3.853 ms", "4.103 ms", "3.704 ms", "3.716 ms", "H100", 5),
    ("layer_norm", "4096x16384", "fwd", "170 us", "170 us", "170 us", "123 us", "H100", 2),
    ("matmul", "64x8192x8192", "fwd", "55 us", "-", "55 us", "47 us", "H100", 2),
    ("softmax", "4096x32768", "fwd", "387 us", "-", "353 us", "251 us", "H100", 2),
)  # fmt: skip

#: First calls and peak memory the same sections report at these shapes.
FIRST_CALLS_AND_PEAKS = (
    "MoE layer [1]: first call 3.5 s plain, 7.3 s tokamax, 10.4 s kt untuned; peak 14.25, "
    "6.38, 6.06 GiB.",
    "loss head [4]: first call 4.3 s plain, 1.4 s kt untuned, 11.4 s kt tuned; peak 12.85 "
    "GiB plain, 2.72 GiB kt.",
    "attention (window) [3]: first call 0.2 s cuDNN, 7.9 s kt; peak 0.56 GiB both.",
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
