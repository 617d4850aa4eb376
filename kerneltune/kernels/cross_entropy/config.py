"""The loss head's config, its heuristic and its candidate space pruned by what fits.

Three backends, each a different trade of memory against speed:

- "xla" materialises the `[M, V]` logits and lets JAX differentiate them: three
  matmuls, cuBLAS speed, the most memory.
- "chunked" walks the tokens in chunks of `chunk_size` (a `lax.scan` in plain JAX);
  under a gradient each chunk's gradients are computed during the forward, so the
  backward only scales them (still three matmuls). Memory: one chunk's `[chunk, V]`
  intermediates instead of every token's. Each chunk's log-sum-exp is taken by
  `lse_backend`: XLA's reduction, or a Pallas kernel that reads the logits at memory
  speed (1.6–1.8× faster on an H100, where it is the heuristic).
- "triton" is a fused Pallas kernel that keeps a running log-sum-exp per row over
  blocks of the vocabulary and never stores a logit; its backward recomputes the
  logits chunk by chunk from the saved log-sum-exp (four matmuls, the least memory).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np

from kerneltune._src.core.configs import config_to_dict
from kerneltune._src.params import check_one_of, check_positive_power_of_two
from kerneltune.kernels._common import (
    MAX_REGISTERS_PER_THREAD,
    Pruned,
    WithItemsize,
    next_power_of_2,
    prune,
    shared_memory_limit,
    shared_memory_rule,
)
from kerneltune.kernels._config import BackendConfig
from kerneltune.kernels._tiles import MIN_BLOCK as MIN_BLOCK
from kerneltune.kernels._tiles import (
    block_for,
    check_blocks,
    check_launch,
    larger_than_dims,
    not_dividing,
)
from kerneltune.kernels.cross_entropy import lse_triton

BACKENDS = ("xla", "chunked", "triton")
Backend = Literal["xla", "chunked", "triton"]
LOGITS_DTYPES = ("float32", "input")
LogitsDtype = Literal["float32", "input"]
LSE_BACKENDS = ("xla", "triton")
LseBackend = Literal["xla", "triton"]
#: The smallest chunk of tokens the chunked path takes.
MIN_CHUNK = 8

_TRITON_DEFAULTS: dict[str, Any] = {
    "block_m": 64,
    "block_v": 128,
    "block_k": 64,
    "num_warps": 4,
    "num_stages": 2,
}
#: Tokens per chunk of the chunked backward that the Triton backend's gradient uses.
DEFAULT_CHUNK = 4096
#: The most logits (in bytes, in their dtype) one chunk of the chunked backend may hold.
#: The chunked path exists to bound memory: timed alone, the largest chunk wins (at
#: 16384 tokens and a 128k vocabulary one chunk of 16384 held 8.1 GiB, half of plain
#: JAX's 16.8 GiB), so the space stops where a chunk's logits pass this. A chunk also
#: holds its 16-bit logit gradients and the float32 `d_W` accumulator (`K × V`): at
#: this bound a 128k-vocabulary head's chunked step stays near 3 GiB.
CHUNK_LOGITS_BYTES = 1 << 29
#: Under a gradient the heuristic splits a call into chunks only where its logits (in
#: the dtype they are written in) pass this, and a chunk of at least
#: `MIN_HEURISTIC_CHUNK` tokens and `K` fits the bound above; otherwise the call is one
#: chunk. On an H100 (forward + backward, bf16, against plain JAX's 16-bit logits), one
#: chunk, its gradient written over its logits, ran 1.10× at 8192 × 2048 → 128256 with
#: 44% of plain JAX's memory, 1.03× at 8192 × 4096 → 32000 (59%) and → 256000 (51%);
#: chunks of 2048 tokens 0.99×, 0.91× and 0.99× there. Chunks of 2048 were 1.03–1.09×
#: at 16384 and 32768 × 2048 → 128256 with 12–21% of the memory, where one chunk (1.13×
#: before it was written in place) holds 70%. Smaller chunks lose: every chunk reads
#: and writes the float32 `K × V` accumulator of `d_W` (at 8192 × 4096 → 256000 chunks
#: of 1024 were 0.91×).
CHUNK_ABOVE_BYTES = 2 << 30
MIN_HEURISTIC_CHUNK = 2048


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class CrossEntropyConfig(BackendConfig):
    """How `linear_softmax_cross_entropy` runs.

    Attributes:
      backend: "xla" (materialise the logits), "chunked" (a scan over chunks of tokens)
        or "triton" (the fused Pallas kernel). See the module docstring for the trade.
      chunk_size: tokens per chunk: the chunked forward's, and the chunked backward's
        that the "triton" backend uses under a gradient. None with "xla".
      logits_dtype: ("xla", "chunked") "float32" (the default) or "input": the dtype
        the matmul writes the logits in (see the module docstring). The "triton"
        backend keeps its logits in float32 registers and takes None.
      lse_backend: ("chunked") what reads each chunk's written logits for their
        log-sum-exp and label logits: "xla" (the default; one XLA reduction) or
        "triton" (`lse_triton`'s Pallas kernel; XLA's reduction where the vocabulary
        is narrower than its block of columns).
      block_m, block_v, block_k: ("triton") rows, vocabulary columns and shared-dim
        steps of one program's logit tile.
      num_warps, num_stages: ("triton") warps per program and pipelining depth.

    Example:
      >>> CrossEntropyConfig(backend="chunked", chunk_size=2048, logits_dtype="input")
      CrossEntropyConfig(backend='chunked', chunk_size=2048, logits_dtype='input', \
lse_backend='xla')
      >>> CrossEntropyConfig(backend="chunked", chunk_size=1000)
      Traceback (most recent call last):
      ...
      ValueError: CrossEntropyConfig.chunk_size must be a positive power of two, got 1000.
    """

    backend: Backend = "xla"
    chunk_size: int | None = None
    logits_dtype: LogitsDtype | None = None
    lse_backend: LseBackend | None = None
    block_m: int | None = None
    block_v: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    backend_fields: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "xla": {"logits_dtype": "float32"},
        "chunked": {"chunk_size": DEFAULT_CHUNK, "logits_dtype": "float32", "lse_backend": "xla"},
        "triton": {"chunk_size": DEFAULT_CHUNK, **_TRITON_DEFAULTS},
    }

    def check(self) -> None:
        owner = "CrossEntropyConfig"
        if self.backend != "triton":
            check_one_of(owner, "logits_dtype", self.logits_dtype, LOGITS_DTYPES)
        if self.backend == "xla":
            return
        if self.backend == "chunked":
            check_one_of(owner, "lse_backend", self.lse_backend, LSE_BACKENDS)
        check_positive_power_of_two(owner, "chunk_size", self.chunk_size)
        assert self.chunk_size is not None
        if self.chunk_size < MIN_CHUNK:
            raise ValueError(
                f"{owner}.chunk_size must be at least {MIN_CHUNK}, got {self.chunk_size}."
            )
        if self.backend == "triton":
            check_blocks(self, ("block_m", "block_v", "block_k"))
            check_launch(self)


def logits_dtype(cfg: CrossEntropyConfig, x: Any) -> Any:
    """The dtype `cfg`'s matmuls write the logits in, for inputs like `x` (the fused
    kernel's backward recomputes them in float32)."""
    return x.dtype if cfg.logits_dtype == "input" else np.dtype(np.float32)


@dataclasses.dataclass(frozen=True)
class CrossEntropyProblem(WithItemsize):
    """`x[m, k] @ w[k, v]` then a softmax cross-entropy per row, in `dtype`."""

    m: int
    k: int
    v: int
    dtype: np.dtype

    def logits_bytes(self, rows: int, logits_dtype: str | None) -> int:
        """Bytes of `rows` rows of logits written in `logits_dtype`."""
        size = 4 if logits_dtype == "float32" else max(self.itemsize, 2)
        return rows * self.v * size


def one_chunk(p: CrossEntropyProblem) -> int:
    """The chunk size that makes `p` one chunk: no scan, `d_W` written once in the
    weights' dtype, every logit held (but no float32 `[M, V]` array, as XLA's
    differentiated program writes)."""
    return _one_chunk_of(p.m)


def _one_chunk_of(m: int) -> int:
    return max(MIN_CHUNK, next_power_of_2(max(m, 1)))


#: What a chunk as long as the call (`one_chunk`) is called when configs of calls of
#: different lengths are compared (`across_sizes`).
ONE_CHUNK = "one chunk"


def across_sizes(cfg: Any, m: int) -> dict[str, Any]:
    """`cfg`'s fields (of a call of `m` tokens) as they compare across lengths: a
    `chunk_size` that makes the call one chunk is `ONE_CHUNK`, the same program (no scan,
    every logit held) at any length, where 4096 tokens are one chunk of a 4096-token
    call and four of a 16384-token one. Leave-one-out over the H200 table's two loss
    heads (both won by one chunk), matching chunk sizes as numbers put the prediction
    6.2% and 11.8% behind; as this, 0.0% (BENCHMARKS.md, 2026-12-07)."""
    fields = config_to_dict(cfg)
    chunk = fields.get("chunk_size")
    if isinstance(chunk, int) and chunk >= _one_chunk_of(m):
        fields["chunk_size"] = ONE_CHUNK
    return fields


def chunk_too_large(p: CrossEntropyProblem, chunk: int, logits_dtype: str | None) -> str | None:
    """Why chunks of `chunk` tokens do not belong in `p`'s chunked space (None when
    they do): larger than the one chunk that holds the call (the same program), or
    smaller than the call and holding more than `CHUNK_LOGITS_BYTES` of logits (the
    smallest timed chunk is kept whatever its size). The one chunk is the materialising
    config and is kept whatever its size."""
    if chunk >= p.m:
        if chunk == one_chunk(p):
            return None
        return (
            f"chunk_size={chunk} is one chunk of the {p.m} tokens: the same program as "
            f"chunk_size={one_chunk(p)}"
        )
    logits = p.logits_bytes(chunk, logits_dtype)
    if logits > CHUNK_LOGITS_BYTES and chunk > CHUNKS_TIMED[0]:
        dtype = "float32" if logits_dtype == "float32" else p.dtype
        return (
            f"one chunk of {chunk} tokens holds {logits / 2**30:.2f} GiB of {dtype} logits "
            f"(at most {CHUNK_LOGITS_BYTES / 2**30:.2f} GiB: the chunked path is there to "
            "bound memory)"
        )
    return None


XLA = CrossEntropyConfig(backend="xla")
#: Plain JAX's `x @ w` program: the logits in the inputs' dtype.
XLA_INPUT_LOGITS = CrossEntropyConfig(backend="xla", logits_dtype="input")


def chunked(
    chunk_size: int, logits_dtype: LogitsDtype = "float32", lse_backend: LseBackend = "xla"
) -> CrossEntropyConfig:
    return CrossEntropyConfig(
        backend="chunked",
        chunk_size=chunk_size,
        logits_dtype=logits_dtype,
        lse_backend=lse_backend,
    )


def heuristic(
    p: CrossEntropyProblem,
    *,
    training: bool = False,
    lse_backend: LseBackend = "xla",
    pallas: bool = True,
) -> CrossEntropyConfig:
    """The chunked path in the inputs' dtype (the same three matmuls under a gradient,
    the gradients taken in the forward): in chunks of tokens where the logits pass
    `CHUNK_ABOVE_BYTES` and chunks large enough not to lose speed fit the memory bound,
    otherwise as one chunk, which is faster than plain JAX's differentiated program and
    holds less (see `CHUNK_ABOVE_BYTES`). Its log-sum-exp is taken by `lse_backend`
    where that kernel takes the vocabulary ("triton" on GPUs).

    Where nothing is differentiated and the log-sum-exp is XLA's (off GPUs), plain
    JAX's program: the logits materialised in the inputs' dtype. Where no Pallas kernel
    runs (`pallas=False`: a CPU) a training step is plain JAX's program too up to
    `CHUNK_ABOVE_BYTES` of logits, as much memory as plain JAX's: on this project's
    2-core CPU (BENCHMARKS.md, 2026-12-08) one chunk took 1.05-1.27x its time (its
    gradient written over the logits in steps of rows), chunks of 512-1024 tokens
    1.00-1.24x. With the Pallas pass
    the chunked forward ran 1.00–1.09× plain JAX's on an H100 (bf16, the loss head
    benchmark's four shapes; XLA's program 1.00–1.04× in the same run), with 24% of
    plain's memory at 16384 × 2048 → 128256 (1.08 against 4.50 GiB) and 13% at 32768
    tokens.

    Example:
      >>> import numpy as np
      >>> p = CrossEntropyProblem(16384, 2048, 128256, np.dtype("bfloat16"))
      >>> heuristic(p).backend, heuristic(p, training=True).chunk_size
      ('xla', 2048)
      >>> heuristic(p, lse_backend="triton").chunk_size  # a forward on a GPU
      2048
      >>> heuristic(CrossEntropyProblem(8192, 2048, 128256, p.dtype), training=True).chunk_size
      8192
    """
    # With float32 inputs "input" is "float32": name the one config the space keeps.
    logits: LogitsDtype = "input" if p.itemsize < 4 else "float32"
    lse = lse_backend if lse_unsupported(p, lse_backend) is None else "xla"
    if not training and lse == "xla":
        return CrossEntropyConfig(backend="xla", logits_dtype=logits)
    if not pallas and p.logits_bytes(p.m, logits) <= CHUNK_ABOVE_BYTES:
        return CrossEntropyConfig(backend="xla", logits_dtype=logits)
    chunk = largest_chunk(p, logits)
    if (
        p.logits_bytes(p.m, logits) > CHUNK_ABOVE_BYTES
        and chunk is not None
        and chunk >= max(MIN_HEURISTIC_CHUNK, p.k)
    ):
        return chunked(chunk, logits, lse)
    return chunked(one_chunk(p), logits, lse)


def lse_unsupported(p: CrossEntropyProblem, lse_backend: str | None) -> str | None:
    """Why `lse_backend` would not run `p`'s log-sum-exp pass (the chunked path then
    takes XLA's reduction: the same program as "xla"), or None when it would."""
    if lse_backend == "triton" and lse_triton.tiles_for(p.v) is None:
        return (
            f"the vocabulary ({p.v}) is narrower than the log-sum-exp kernel's narrowest "
            f"block of {lse_triton.MIN_BLOCK_V} columns: the same program as lse_backend='xla'"
        )
    return None


def largest_chunk(p: CrossEntropyProblem, logits_dtype: LogitsDtype) -> int | None:
    """The largest timed chunk smaller than the call whose logits stay within
    `CHUNK_LOGITS_BYTES` (the smallest timed chunk whatever its size); None when even
    that is not smaller than the call."""
    fitting = [c for c in CHUNKS_TIMED if c < p.m and chunk_too_large(p, c, logits_dtype) is None]
    return max(fitting) if fitting else None


def triton_heuristic(p: CrossEntropyProblem) -> CrossEntropyConfig:
    """A fused-kernel config that fits any shape: the default tiles (64 rows, 128
    vocabulary columns, 64-wide shared-dim steps), shrunk to a small problem."""
    default = _TRITON_DEFAULTS
    return CrossEntropyConfig(
        backend="triton",
        chunk_size=max(MIN_CHUNK, min(DEFAULT_CHUNK, next_power_of_2(p.m))),
        block_m=block_for(p.m, default["block_m"]),
        block_v=block_for(p.v, default["block_v"]),
        block_k=block_for(p.k, default["block_k"]),
    )


def shared_memory_bytes(p: CrossEntropyProblem, c: CrossEntropyConfig) -> int:
    """The pipelined inner loop's `x` and `w` tiles, per stage."""
    assert c.block_m and c.block_v and c.block_k and c.num_stages
    return c.num_stages * (c.block_m * c.block_k + c.block_k * c.block_v) * p.itemsize


#: The chunk sizes the GPU tuner times; the smallest is kept whatever the vocabulary.
CHUNKS_TIMED = (1024, 2048, 4096, 8192, 16384)


def candidate_space(p: CrossEntropyProblem, *, training: bool) -> list[CrossEntropyConfig]:
    """Every config considered before pruning: XLA, chunks of 1k to 16k tokens and
    the one chunk of every token (their log-sum-exp by the Pallas kernel, and the
    heuristic's chunks by XLA's reduction too, in case the kernel loses on some
    device), and a modest set of fused-kernel tiles (fewer under a gradient, where the
    backward, not the tiles, decides the time)."""
    space = [XLA_INPUT_LOGITS, XLA]
    sizes = sorted({*CHUNKS_TIMED, one_chunk(p)})
    space += [chunked(c, d, "triton") for d in ("input", "float32") for c in sizes]
    if training:
        space.append(heuristic(p, training=True, lse_backend="xla"))
    tiles = ((64, 128, 64), (64, 256, 64), (128, 128, 64), (128, 256, 64), (64, 128, 128))
    warps = (4,) if training else (4, 8)
    stages = (3,) if training else (2, 3, 4)
    for (bm, bv, bk), w, s in itertools.product(tiles, warps, stages):
        space.append(
            CrossEntropyConfig(
                backend="triton",
                chunk_size=DEFAULT_CHUNK,
                block_m=bm,
                block_v=bv,
                block_k=bk,
                num_warps=w,
                num_stages=s,
            )
        )
    return space


def rules(p: CrossEntropyProblem, smem_limit: int | None = None):
    """The pruning rules for `p`: each returns None or why a config cannot run it."""
    limit = shared_memory_limit() if smem_limit is None else smem_limit
    tiling = (("block_m", p.m, "M"), ("block_v", p.v, "V"), ("block_k", p.k, "K"))

    def logits_dtype_differs(c: CrossEntropyConfig) -> str | None:
        if c.logits_dtype == "input" and p.itemsize >= 4:
            return f"the inputs are {p.dtype}: the same program as logits_dtype='float32'"
        return None

    def chunk_fits(c: CrossEntropyConfig) -> str | None:
        if c.backend != "chunked" or not c.chunk_size:
            return None
        return chunk_too_large(p, c.chunk_size, c.logits_dtype)

    def lse_kernel_takes(c: CrossEntropyConfig) -> str | None:
        return lse_unsupported(p, c.lse_backend) if c.backend == "chunked" else None

    def tiles_fit(c: CrossEntropyConfig) -> str | None:
        if c.backend != "triton":
            return None
        return larger_than_dims(c, tiling) or not_dividing(c, tiling[2:])

    def fits_smem(c: CrossEntropyConfig) -> str | None:
        if c.backend != "triton":
            return None
        tiles = (
            f"{c.num_stages} stages × ({c.block_m}×{c.block_k} + {c.block_k}×{c.block_v}) "
            f"× {p.itemsize} B"
        )
        return shared_memory_rule(shared_memory_bytes(p, c), limit, tiles)

    def fits_registers(c: CrossEntropyConfig) -> str | None:
        if c.backend != "triton":
            return None
        assert c.block_m and c.block_v and c.num_warps
        regs = c.block_m * c.block_v // (32 * c.num_warps)
        if regs > MAX_REGISTERS_PER_THREAD // 2:  # the logit tile and its exponentials
            return (
                f"the {c.block_m}×{c.block_v} float32 logit tile needs {regs} registers per "
                f"thread with {c.num_warps} warps, twice over: it would spill"
            )
        return None

    return [
        logits_dtype_differs,
        chunk_fits,
        lse_kernel_takes,
        tiles_fit,
        fits_smem,
        fits_registers,
    ]


def candidates(
    p: CrossEntropyProblem, *, training: bool = False, smem_limit: int | None = None
) -> tuple[list[CrossEntropyConfig], list[Pruned[CrossEntropyConfig]]]:
    """The GPU candidates for `p` that can run, and every pruned one with its reason;
    XLA (plain JAX's program) always competes.

    Example:
      >>> import numpy as np
      >>> kept, pruned = candidates(CrossEntropyProblem(16384, 2048, 128256, np.dtype("bfloat16")))
      >>> kept[0].backend, any(c.backend == "triton" for c in kept)
      ('xla', True)
      >>> kept, pruned = candidates(CrossEntropyProblem(512, 64, 1000, np.dtype("float32")))
      >>> [c.chunk_size for c in kept if c.backend == "chunked"], len(pruned) > 0
      ([512], True)
    """
    kept, pruned = prune(
        candidate_space(p, training=training),
        rules(p, smem_limit),
        what=f"linear_softmax_cross_entropy {p.m}x{p.k}x{p.v}",
    )
    return kept, pruned


def interpret_candidates(p: CrossEntropyProblem) -> list[CrossEntropyConfig]:
    """A few configs the Pallas interpreter runs in reasonable time: XLA (and plain
    JAX's 16-bit logits, for 16-bit inputs), two chunk sizes, the one chunk (the
    heuristic under a gradient; also with the log-sum-exp kernel) and two small
    fused-kernel tiles."""
    out = [XLA, *(chunked(c) for c in (16, 32) if c < p.m), chunked(one_chunk(p))]
    lse: LseBackend = "triton" if lse_unsupported(p, "triton") is None else "xla"
    if p.itemsize < 4:  # 16-bit logits: the heuristics, and a chunk of them
        out += [XLA_INPUT_LOGITS, chunked(one_chunk(p), "input")]
        if MIN_CHUNK * 2 < p.m:
            out.append(chunked(MIN_CHUNK * 2, "input", lse))
    if lse == "triton":
        out.append(chunked(one_chunk(p), "input" if p.itemsize < 4 else "float32", lse))
    h = triton_heuristic(p)
    out.append(h)
    small = dataclasses.replace(h, block_m=MIN_BLOCK, block_v=32, chunk_size=MIN_CHUNK * 2)
    if small not in out and p.k % small.block_k == 0:  # type: ignore[operator]
        out.append(small)
    return out
