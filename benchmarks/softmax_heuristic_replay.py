"""The softmax heuristic's warp count scored on the shipped tables' recorded timings
(every warp count was timed at every key), beside JAX's fixed 4 warps: how far behind
the fastest warp count each is, per key and in median and worst case. No GPU needed:
the times are the tables'.

    python -m benchmarks.softmax_heuristic_replay
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import numpy as np

from kerneltune._src.caching import storage
from kerneltune._src.caching.shipped import PACKAGE_TABLES
from kerneltune.kernels.softmax import config as softmax_config

#: JAX's Pallas softmax's default, the heuristic before 2026-12-06.
FIXED_WARPS = 4


def rows(path) -> list[tuple[int, int, int, float, float]]:
    """(rows, width, heuristic warps, its regret, 4 warps' regret) of each softmax key."""
    out = []
    for e in storage.read_export_file(str(path)):
        if not e["op_id"].startswith("softmax@"):
            continue
        r, w = e["shape"]["sizes"][:2]
        times = {c["cfg"]["num_warps"]: c["time_s"] for c in e["candidates"] if c["time_s"]}
        best = min(times.values())
        problem = softmax_config.SoftmaxProblem(r, w, np.dtype("bfloat16"))
        warps = softmax_config.heuristic(problem).num_warps
        out.append((r, w, warps, times[warps] / best - 1, times[FIXED_WARPS] / best - 1))
    return sorted(out)


def main(argv: Sequence[str] | None = None) -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    print("| table | rows x width | heuristic warps | its regret | 4 warps' regret |")
    print("| --- | --- | ---: | ---: | ---: |")
    summary = []
    for path in sorted(PACKAGE_TABLES.glob("*.json")):
        found = rows(path)
        for r, w, warps, ours, fixed in found:
            print(f"| {path.stem} | {r}x{w} | {warps} | {ours:.1%} | {fixed:.1%} |")
        if found:
            ours_all, fixed_all = [f[3] for f in found], [f[4] for f in found]
            summary.append(
                f"{path.stem}: {len(found)} keys; heuristic {statistics.median(ours_all):.1%} "
                f"median / {max(ours_all):.1%} worst; 4 warps "
                f"{statistics.median(fixed_all):.1%} / {max(fixed_all):.1%}"
            )
    print("\n" + "\n".join(summary))


if __name__ == "__main__":
    main()
