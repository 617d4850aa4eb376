"""Persistent-cache latency as the cache grows: put and get with 100, 10 000 and
100 000 entries.

The cache is filled by writing entry files directly (what thousands of puts would leave
behind, only faster); puts and gets are then timed one call at a time through the
`PersistentCache` API, on keys picked at random. Every entry carries a tuning report of
16 candidates, like a real one.

    python benchmarks/cache_bench.py [--sizes 100,10000,100000] [--calls 1000] [--dir DIR]

`--dir` picks the filesystem to measure (default: the system's temporary directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kerneltune._src.caching import cache_entry
from kerneltune._src.caching.persistent import PersistentCache
from kerneltune._src.tuning.report import CandidateResult, TuningReport

DEV = "NVIDIA H200|cuda 13000"
OPS = ("matmul@v1", "attention@v2", "layer_norm@v1", "softmax@v1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatmulCfg:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def cfg_for(i: int) -> MatmulCfg:
    return MatmulCfg(
        block_m=2 ** (4 + i % 4),
        block_n=2 ** (4 + i // 4 % 4),
        block_k=2 ** (5 + i // 16 % 3),
        num_warps=2 ** (i % 3 + 1),
        num_stages=i % 4 + 1,
    )


def report_for(best: MatmulCfg) -> TuningReport:
    candidates = tuple(
        CandidateResult(
            cfg=cfg_for(j),
            time_s=1e-4 * (1 + j),
            samples_s=tuple(1e-4 * (1 + j) + 1e-7 * s for s in range(5)),
            compile_s=0.3,
        )
        for j in range(16)
    )
    return TuningReport(
        best=best,
        candidates=candidates,
        timer="cupti",
        heuristic_cfg=cfg_for(3),
        heuristic_time_s=4e-4,
    )


def key_of(i: int) -> tuple[str, str, str]:
    return DEV, OPS[i % len(OPS)], f"{i:032x}"


def fill(root: str, count: int) -> float:
    """Writes `count` entries straight into the cache directory; returns the seconds."""
    template_cache = PersistentCache(os.path.join(root, "template"))
    template_cache.put(*key_of(0), cfg_for(0), report=report_for(cfg_for(0)), signature="x")
    template = next(template_cache.entries()).to_document()
    shutil.rmtree(os.path.join(root, "template"))

    start = time.perf_counter()
    entries_dir = os.path.join(root, "cache", "configs")
    made: set[str] = set()
    for i in range(count):
        dev, op, key = key_of(i)
        doc = dict(
            template,
            op_id=op,
            call_key=key,
            cfg=dataclasses.asdict(cfg_for(i)),
            signature=f"bf16[{128 * (1 + i % 64)},4096], bf16[4096,{64 * (1 + i // 64 % 64)}]",
        )
        path = os.path.join(entries_dir, *cache_entry.entry_relpath(dev, op, key).split("/"))
        folder = os.path.dirname(path)
        if folder not in made:
            os.makedirs(folder, exist_ok=True)
            made.add(folder)
        with open(path, "w") as f:
            json.dump(doc, f, sort_keys=True)
    return time.perf_counter() - start


def timed(fn, args_list) -> list[float]:
    out = []
    for args in args_list:
        start = time.perf_counter_ns()
        fn(*args)
        out.append((time.perf_counter_ns() - start) / 1e3)
    return out


def stats(samples_us: list[float]) -> tuple[float, float]:
    ordered = sorted(samples_us)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


def bench(base: str, count: int, calls: int, rng: random.Random) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix=f"kt-bench-{count}-", dir=base)
    try:
        fill_s = fill(root, count)
        cache = PersistentCache(os.path.join(root, "cache"))
        assert cache.get(*key_of(count - 1), MatmulCfg) == cfg_for(count - 1)

        hits = [(*key_of(rng.randrange(count)), MatmulCfg) for _ in range(calls)]
        misses = [(DEV, "matmul@v1", f"missing-{i}", MatmulCfg) for i in range(calls)]
        timed(cache.get, hits[:50])  # warm up the interpreter's paths, not the data
        get_us = timed(cache.get, hits)
        miss_us = timed(cache.get, misses)

        new = [(*key_of(count + i), cfg_for(i)) for i in range(min(calls, 500))]
        report = report_for(cfg_for(0))
        put_us = timed(lambda *a: cache.put(*a, report=report, signature="x"), new)
        fast = PersistentCache(os.path.join(root, "cache"), fsync=False)
        new = [(*key_of(2 * count + calls + i), cfg_for(i)) for i in range(min(calls, 500))]
        put_nofsync_us = timed(lambda *a: fast.put(*a, report=report, signature="x"), new)
        assert cache.get(*new[-1][:3], MatmulCfg) == new[-1][3]
        return {
            "entries": count,
            "fill_s": fill_s,
            "put": stats(put_us),
            "put_nofsync": stats(put_nofsync_us),
            "get": stats(get_us),
            "miss": stats(miss_us),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="100,10000,100000", help="cache entries, comma-separated"
    )
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per figure")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to build the caches")
    parser.add_argument("--seed", type=int, default=0, help="of the random keys")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sizes = [int(s) for s in args.sizes.split(",")]

    print(
        f"kerneltune persistent cache: {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs, caches under {args.dir}"
    )
    print("median / p90 microseconds per call, one call at a time\n")
    header = f"{'entries':>8}  {'put':>15}  {'put, no fsync':>15}  {'get (hit)':>15}  {'get (miss)':>15}  {'fill':>7}"
    print(header)
    print("-" * len(header))
    rows = []
    for count in sizes:
        row = bench(args.dir, count, args.calls, rng)
        rows.append(row)
        cells = [
            f"{row[name][0]:7.1f} / {row[name][1]:5.0f}"
            for name in ("put", "put_nofsync", "get", "miss")
        ]
        print(
            f"{count:>8}  " + "  ".join(f"{c:>15}" for c in cells) + f"  {row['fill_s']:6.1f}s",
            flush=True,
        )
    if len(rows) > 1:
        growth = rows[-1]["get"][0] / rows[0]["get"][0]
        print(
            f"\nget median at {rows[-1]['entries']} entries is {growth:.2f}x the one at "
            f"{rows[0]['entries']} (one file read per lookup: it should stay near 1x)."
        )


if __name__ == "__main__":
    main()
