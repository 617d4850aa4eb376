"""Attention configs: `FwdParams` for the forward kernel and `BwdParams` for the
backward kernel, each with a heuristic (JAX's defaults) and a pruned candidate space.

The two passes are separate ops (`attention` and `attention_bwd`), tuned separately:
the best forward blocks say little about the best backward blocks.

`BwdParams` names the backward kernels' two block sizes as JAX's fused backward
kernel named them (ours keeps the meaning, so tuned configs carry over):
`kv_blocksize` is the block of keys/values each program owns while accumulating
dK/dV (and the block of queries it owns while accumulating dQ; the rules keep the
two splits alike, as JAX's kernel required); `q_blocksize` is the block of queries
its inner loop steps through for dK/dV (and the block of keys/values it steps through
for dQ).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax.numpy as jnp
import numpy as np

from kerneltune._src.params import BwdParams, FwdParams
from kerneltune.kernels._common import (
    MAX_REGISTERS_PER_THREAD,
    Pruned,
    next_power_of_2,
    on_gpu,
    prune,
    shared_memory_limit,
    shared_memory_rule,
)
from kerneltune.kernels.attention import tokamax_backend


@dataclasses.dataclass(frozen=True)
class AttentionProblem:
    """q is `[batch, q_len, heads, head_dim]`, k and v `[batch, kv_len, heads, head_dim]`."""

    batch: int
    q_len: int
    kv_len: int
    heads: int
    head_dim: int
    dtype: np.dtype
    causal: bool

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def padded_head_dim(self) -> int:
        return next_power_of_2(self.head_dim)


# --- forward -----------------------------------------------------------------------


def fwd_heuristic(p: AttentionProblem) -> FwdParams:
    """JAX's defaults for `mha`: 128×128 blocks, 4 warps up to head dim 64 and 8
    above, 2 stages (blocks shrink to the sequence for short ones)."""
    return FwdParams(
        q_blocksize=min(128, next_power_of_2(p.q_len)),
        kv_blocksize=min(128, next_power_of_2(p.kv_len)),
        num_warps=4 if p.head_dim <= 64 else 8,
        num_stages=2,
    )


def fwd_shared_memory_bytes(p: AttentionProblem, c: FwdParams) -> int:
    """The q tile stays resident; each pipeline stage holds a k and a v tile."""
    d = p.padded_head_dim
    assert c.q_blocksize and c.kv_blocksize and c.num_stages
    return (c.q_blocksize * d + c.num_stages * 2 * c.kv_blocksize * d) * p.itemsize


def fwd_rules(p: AttentionProblem, smem_limit: int | None = None):
    limit = shared_memory_limit() if smem_limit is None else smem_limit
    d = p.padded_head_dim

    def divides(c: FwdParams) -> str | None:
        if p.q_len % c.q_blocksize:  # type: ignore[operator]
            return f"q_len={p.q_len} is not a multiple of q_blocksize={c.q_blocksize}"
        if p.kv_len % c.kv_blocksize:  # type: ignore[operator]
            return f"kv_len={p.kv_len} is not a multiple of kv_blocksize={c.kv_blocksize}"
        return None

    def fits_smem(c: FwdParams) -> str | None:
        return shared_memory_rule(fwd_shared_memory_bytes(p, c), limit)

    def fits_registers(c: FwdParams) -> str | None:
        # The float32 output accumulator and the q×k score tile live in registers.
        regs = (c.q_blocksize * d + c.q_blocksize * c.kv_blocksize) // (32 * c.num_warps)  # type: ignore[operator]
        if regs > MAX_REGISTERS_PER_THREAD:
            return (
                f"accumulator and score tile need {regs} registers per thread with "
                f"{c.num_warps} warps (at most {MAX_REGISTERS_PER_THREAD}): they would spill"
            )
        if c.q_blocksize * c.kv_blocksize < 32 * c.num_warps * 4:  # type: ignore[operator]
            return f"{c.num_warps} warps are too many for a {c.q_blocksize}×{c.kv_blocksize} score tile"
        return None

    return [divides, fits_smem, fits_registers]


def fwd_candidates(
    p: AttentionProblem, smem_limit: int | None = None
) -> tuple[list[FwdParams], list[Pruned[FwdParams]]]:
    """Forward candidates that can fit, and the pruned ones with their reasons.

    Example:
      >>> import numpy as np
      >>> p = AttentionProblem(4, 2048, 2048, 16, 128, np.dtype("bfloat16"), True)
      >>> kept, pruned = fwd_candidates(p)
      >>> fwd_heuristic(p) in kept, len(kept) > 10
      (True, True)
    """
    blocks = (32, 64, 128)
    space = [
        FwdParams(q_blocksize=bq, kv_blocksize=bk, num_warps=w, num_stages=s)
        for bq, bk, w, s in itertools.product(blocks, blocks, (4, 8), (1, 2, 3))
        if bq <= max(16, p.q_len) and bk <= max(16, p.kv_len)
    ]
    kept, pruned = prune(space, fwd_rules(p, smem_limit), what=f"attention fwd {p}")
    heuristic = fwd_heuristic(p)
    if heuristic not in kept:
        kept.insert(0, heuristic)
    # The library backends: XLA runs everything; cuDNN and tokamax where they support
    # the call.
    kept.append(XLA)
    for backend, reason in (
        (TOKAMAX, tokamax_backend.unsupported(p.dtype, p.head_dim)),
        (CUDNN, cudnn_unsupported(p)),  # inserted last: first of the candidates
    ):
        if reason is None:
            kept.insert(0, backend)
        else:
            pruned.append(Pruned(backend, reason))
    return kept, pruned


#: The longest sequence the shipped tables and the benchmarks cover (`ATTENTION` in
#: `tools/ship_tables.py`): beyond it nothing was measured to favour a tuned Pallas
#: block over the libraries.
LONGEST_MEASURED_SEQUENCE = 8192


#: From this many queries and keys a causal forward alone with head dim 128 runs tokamax
#: where tokamax runs, and nothing else is timed (`tokamax_causal_forward`). tokamax's
#: forward took 0.91-0.97x cuDNN's time in every such call measured: on an H100
#: (BENCHMARKS.md, 2026-12-06; B1, 16/4 heads) 0.96x at 8k, 0.91x at 16k and 0.95x at 32k
#: tokens; on an H200 (2026-11-29) 0.97x in the table's B2 T8192 key, 0.92-0.96x at 16k
#: (B1 16/4 and B2 32/8, four runs) and 0.95x at 32k. Where cuDNN's program ran instead
#: (the H100 table, tuned without tokamax, predicts cuDNN) the forward read 0.92-0.96x
#: the best peer's. Not so elsewhere: with head dim 64 and below 8k tokens cuDNN won
#: the H200 table's keys by 1-6%, without the causal mask by 2.6x. A training call hidden
#: from kerneltune (`jax.checkpoint`) reads as a forward: tokamax's backend then runs
#: cuDNN's forward and backward (`tokamax_backend.TokamaxBackend`).
TOKAMAX_CAUSAL_FORWARD_MIN_TOKENS = 8192


def tokamax_causal_forward(p: AttentionProblem, *, differentiated: bool) -> bool:
    """Whether `p` is a long causal forward alone that tokamax runs: see
    `TOKAMAX_CAUSAL_FORWARD_MIN_TOKENS`."""
    return (
        not differentiated
        and p.causal
        and p.head_dim == 128
        and min(p.q_len, p.kv_len) >= TOKAMAX_CAUSAL_FORWARD_MIN_TOKENS
        and tokamax_backend.unsupported(p.dtype, p.head_dim) is None
    )


def for_tokamax_causal_forward(
    p: AttentionProblem, kept: list[FwdParams], pruned: list[Pruned[FwdParams]]
) -> tuple[list[FwdParams], list[Pruned[FwdParams]]]:
    """The forward candidates of a long causal forward alone that tokamax runs
    (`tokamax_causal_forward`): tokamax alone, so the first call compiles one program
    and no table or prediction tuned without tokamax picks cuDNN's."""
    if TOKAMAX not in kept:
        return kept, pruned
    why = (
        f"a causal forward alone of {TOKAMAX_CAUSAL_FORWARD_MIN_TOKENS}+ tokens with head "
        "dim 128 runs tokamax; cuDNN's forward measured 1.03-1.10x its time (H100, H200; "
        "8k-32k tokens)"
    )
    return [TOKAMAX], pruned + [Pruned(c, why) for c in kept if c != TOKAMAX]


def for_long_sequences(
    p: AttentionProblem, kept: list[FwdParams], pruned: list[Pruned[FwdParams]]
) -> tuple[list[FwdParams], list[Pruned[FwdParams]]]:
    """The forward candidates of a call longer than any measured one, where cuDNN runs
    it: the libraries (cuDNN, tokamax) and JAX's default Pallas blocks, no block search
    and no XLA (whose [batch, heads, q, k] logits are 32 GiB at B1 T32k with 16 heads).
    Each candidate's run grows with the square of the sequence: at 128k tokens a block
    search would time some 30 programs of a tenth of a second each, a detour of a
    minute on the first call."""
    longest = max(p.q_len, p.kv_len)
    if longest <= LONGEST_MEASURED_SEQUENCE or cudnn_unsupported(p) is not None:
        return kept, pruned
    heuristic = fwd_heuristic(p)
    why = (
        f"sequences of {longest} tokens (longer than the {LONGEST_MEASURED_SEQUENCE} measured) "
        "time the libraries and the default Pallas blocks only"
    )
    out = [c for c in kept if c.backend in ("cudnn", "tokamax") or c == heuristic]
    return out, pruned + [Pruned(c, why) for c in kept if c not in out]


def for_training(
    p: AttentionProblem, kept: list[FwdParams], pruned: list[Pruned[FwdParams]]
) -> tuple[list[FwdParams], list[Pruned[FwdParams]]]:
    """The forward candidates of a call under a gradient, each timed with its backward.

    The Pallas path's backward is a key of its own: timing a Pallas forward with it
    tunes that key first, and the forward's blocks move a training step little. So
    under a gradient the Pallas path is one candidate (JAX's default blocks). Where
    cuDNN runs the call, it alone is the candidate: on an H100 (BENCHMARKS.md,
    2026-11-24) the forward + backward of Pallas measured 0.30× cuDNN's, XLA's 0.25×
    (and it materialises every logit), tokamax's 0.87–0.99× at four shapes, so timing
    them would only cost tuning time and memory: at 32k tokens, 18 s and 4× plain
    JAX's peak memory for a cuDNN win every time.
    """
    heuristic = fwd_heuristic(p)
    if cudnn_unsupported(p) is None:
        why = (
            "under a gradient cuDNN runs this call; the training steps of Pallas, XLA "
            "and tokamax measured 0.25-0.99x cuDNN's"
        )
        out = [c for c in kept if c == CUDNN]
    else:
        why = "under a gradient only the default Pallas blocks are timed (its backward is tuned apart)"
        out = [c for c in kept if c.backend != "pallas" or c == heuristic]
    return out, pruned + [Pruned(c, why) for c in kept if c not in out]


CUDNN = FwdParams(backend="cudnn")
XLA = FwdParams(backend="xla")
TOKAMAX = FwdParams(backend="tokamax")


def cudnn_unsupported(p: AttentionProblem) -> str | None:
    """Why cuDNN's flash attention cannot run `p`, or None when it can."""
    if not on_gpu():
        return "cuDNN attention runs on NVIDIA GPUs only"
    if p.dtype not in (np.dtype("float16"), np.dtype(jnp.bfloat16)):
        return f"cuDNN attention takes float16 or bfloat16, not {p.dtype}"
    if p.head_dim % 8 or p.head_dim > 128:
        return (
            f"cuDNN attention takes head dims that are multiples of 8 up to 128, not {p.head_dim}"
        )
    return None


def gpu_heuristic(p: AttentionProblem, *, differentiated: bool = False) -> FwdParams:
    """tokamax for a long causal forward alone where it runs (`tokamax_causal_forward`),
    else cuDNN where it supports the call (the fastest attention measured on H100s in
    training and in most forwards), else the Pallas kernel with JAX's defaults."""
    if tokamax_causal_forward(p, differentiated=differentiated):
        return TOKAMAX
    return CUDNN if cudnn_unsupported(p) is None else fwd_heuristic(p)


def fwd_interpret_candidates(p: AttentionProblem) -> list[FwdParams]:
    """A few block shapes for the Pallas interpreter (tests, the CPU demo)."""
    out = [fwd_heuristic(p)]
    for bq, bk in ((32, 32), (64, 64)):
        c = FwdParams(q_blocksize=bq, kv_blocksize=bk, num_warps=4, num_stages=2)
        if p.q_len % bq == 0 and p.kv_len % bk == 0 and c not in out:
            out.append(c)
    return out


# --- backward ----------------------------------------------------------------------


#: The backward in XLA, for lengths the Pallas backward's blocks cannot split alike.
BWD_XLA = BwdParams(backend="xla")


def bwd_splits_alike(q_len: int, kv_len: int, c: BwdParams) -> bool:
    """Whether the Pallas backward can run `c` at these lengths: its outer block
    (`kv_blocksize`) must cut the queries and the keys into as many blocks each."""
    assert c.kv_blocksize is not None
    block = c.kv_blocksize
    return q_len // min(block, q_len) == kv_len // min(block, kv_len)


def bwd_heuristic(p: AttentionProblem) -> BwdParams:
    """JAX's defaults for `mha`'s backward: 32×32 blocks and 4 warps; one outer block
    for short unequal lengths (32 queries, 16 keys), and XLA's backward where no
    block of at most 128 splits the lengths alike."""
    c = BwdParams(
        q_blocksize=min(32, next_power_of_2(p.q_len)),
        kv_blocksize=min(32, next_power_of_2(p.kv_len)),
        num_warps=4,
        num_stages=None,
    )
    if bwd_splits_alike(p.q_len, p.kv_len, c):
        return c
    whole = next_power_of_2(max(p.q_len, p.kv_len))
    if whole <= 128:
        return dataclasses.replace(c, kv_blocksize=whole)
    return BWD_XLA


def bwd_shared_memory_bytes(p: AttentionProblem, c: BwdParams) -> int:
    """Resident k and v tiles (outer block) plus q and dout tiles (inner block), two
    pipeline buffers each."""
    d = p.padded_head_dim
    assert c.q_blocksize and c.kv_blocksize
    return (2 * c.kv_blocksize * d + 2 * 2 * c.q_blocksize * d) * p.itemsize


def bwd_rules(p: AttentionProblem, smem_limit: int | None = None):
    limit = shared_memory_limit() if smem_limit is None else smem_limit
    d = p.padded_head_dim

    def divides(c: BwdParams) -> str | None:
        if not bwd_splits_alike(p.q_len, p.kv_len, c):
            return (
                f"kv_blocksize={c.kv_blocksize} cuts the sequences ({p.q_len}, {p.kv_len}) "
                "into different numbers of blocks; the Pallas backward needs as many"
            )
        if p.kv_len % c.kv_blocksize or p.q_len % c.kv_blocksize:  # type: ignore[operator]
            return f"the sequences ({p.q_len}, {p.kv_len}) are not multiples of kv_blocksize={c.kv_blocksize}"
        if p.q_len % c.q_blocksize or p.kv_len % c.q_blocksize:  # type: ignore[operator]
            return f"the sequences ({p.q_len}, {p.kv_len}) are not multiples of q_blocksize={c.q_blocksize}"
        return None

    def fits_smem(c: BwdParams) -> str | None:
        return shared_memory_rule(bwd_shared_memory_bytes(p, c), limit)

    def fits_registers(c: BwdParams) -> str | None:
        # dK and dV accumulators (outer block × head dim, float32) stay in registers.
        regs = 2 * c.kv_blocksize * d // (32 * c.num_warps)  # type: ignore[operator]
        if regs > MAX_REGISTERS_PER_THREAD:
            return (
                f"the dK/dV accumulators need {regs} registers per thread with "
                f"{c.num_warps} warps (at most {MAX_REGISTERS_PER_THREAD}): they would spill"
            )
        return None

    return [divides, fits_smem, fits_registers]


def bwd_candidates(
    p: AttentionProblem, smem_limit: int | None = None
) -> tuple[list[BwdParams], list[Pruned[BwdParams]]]:
    """Backward candidates that can fit, and the pruned ones with their reasons.
    (`num_stages` is left to the kernel: JAX's backward kernel fixes it.)"""
    space = [
        BwdParams(q_blocksize=bq, kv_blocksize=bk, num_warps=w)
        for bq, bk, w in itertools.product((16, 32, 64), (32, 64, 128), (4, 8))
        if bq <= bk
    ]
    kept, pruned = prune(space, bwd_rules(p, smem_limit), what=f"attention bwd {p}")
    heuristic = bwd_heuristic(p)
    if heuristic not in kept:
        kept.insert(0, heuristic)
    return kept, pruned


def bwd_interpret_candidates(p: AttentionProblem) -> list[BwdParams]:
    out = [bwd_heuristic(p)]
    for bq, bk in ((16, 32), (32, 64)):
        c = BwdParams(q_blocksize=bq, kv_blocksize=bk, num_warps=4)
        fits = p.q_len % bk == 0 and p.kv_len % bk == 0 and bwd_splits_alike(p.q_len, p.kv_len, c)
        if fits and c not in out:
            out.append(c)
    return out
