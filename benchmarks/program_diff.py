"""Which of kerneltune's ops changes a block's optimised program on this device, and how.

    python -m benchmarks.program_diff [--blocks gpt,llama] [--lines 40]

For each op of a block's training step (`model_blocks`), plain JAX's op is replaced by
kerneltune's alone (default executor: the shipped tables, else the heuristic), then every
op at once ("all"), and the optimised HLO of the two steps is compared
(`harness.program_text`: kerneltune's labels and source locations left out). "same"
means the step runs the same kernels as plain JAX's; otherwise the first differing lines
are printed. Compiles only: no timing.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from collections.abc import Sequence

from benchmarks import first_use_gpu
from benchmarks import harness as h
from benchmarks import model_blocks as mb

FIELDS = ("layer_norm", "rms_norm", "matmul", "swiglu", "attention")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--blocks", default="gpt,llama", help="of first_use_gpu.BLOCKS")
    p.add_argument("--lines", type=int, default=40, help="differing lines to print")
    a = p.parse_args(argv)
    plain, kt_ops = mb.plain_ops(), mb.kerneltune_ops()
    for name in a.blocks.split(","):
        block, shape = first_use_gpu.BLOCKS[name]
        args = mb.block_inputs(block, shape)
        base = h.program_text(mb.train_step(block, plain, shape), args).splitlines()
        for field in (*FIELDS, "all"):
            fields = FIELDS if field == "all" else (field,)
            mixed = dataclasses.replace(plain, **{f: getattr(kt_ops, f) for f in fields})
            text = h.program_text(mb.train_step(block, mixed, shape), args).splitlines()
            if text == base:
                print(f"{name} {field}: same", flush=True)
                continue
            diff = difflib.unified_diff(base, text, lineterm="", n=0)
            lines = [d for d in diff if d[:1] in "+-" and d[:3] not in ("---", "+++")]
            print(f"{name} {field}: DIFFERENT ({len(lines)} lines differ)", flush=True)
            print("\n".join(f"    {d[:220]}" for d in lines[: a.lines]), flush=True)


if __name__ == "__main__":
    main()
