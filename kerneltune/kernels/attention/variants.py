"""`AttentionVariants`: attention with a bias, a mask, padding, a local window, a soft
cap or packed documents, chosen per shape among memory-bounded backends.

Plain attention (`api.Attention`) has a flash kernel of its own; a call with any of
these features runs here instead, on one of:

- "cudnn": cuDNN's fused attention through `jax.nn` (GPUs; no soft cap, a window open
  to the left only);
- "cudnn_packed": cuDNN's packed layout for segment ids that are packed documents
  (Hopper; `cudnn_packed.py`): it skips the blocks between documents. The heuristic's
  choice for the forward alone with segment ids from `PACKED_FORWARD_MIN_TOKENS`
  tokens, and where the Mosaic kernel does not run for segment ids from
  `PACKED_MIN_TOKENS` (in training while its backward's memory stays within
  `PACKED_BACKWARD_BYTES`);
- "mosaic": kerneltune's own flash kernel on Mosaic GPU (Hopper; `mosaic_flash*.py`):
  causal, window, lengths, segment ids and a soft cap in the kernel, skipping the key
  blocks a query block cannot see (with packed documents, those of other documents);
  no bias or dense mask;
- "tokamax": tokamax's Mosaic GPU kernel (Hopper, where installed; every variant; a
  differentiated call with a mask runs `tokamax_backend.trusted_gradients` instead);
- "chunked": XLA a block of queries at a time (every platform; memory grows with the
  sequence);
- "xla": XLA with the whole logits, only where the sequence is one block of queries
  (they are then no more than the chunked path's one block).

Segment ids go to the libraries as a mask. Every backend is differentiated by JAX, so
one config serves the forward and a training step (tuned on forward + backward).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from kerneltune._src.core import devices, keys
from kerneltune._src.kernel.backends import BackendKernel, Pruned
from kerneltune._src.kernel.base import Invocation
from kerneltune._src.tuning.inputs import random_like
from kerneltune.kernels._common import next_power_of_2
from kerneltune.kernels._config import BackendConfig
from kerneltune.kernels.attention.chunked import (
    BLOCK_LOGITS_BYTES,
    ChunkedBackend,
    attention_chunked,
    default_block_q,
)
from kerneltune.kernels.attention.cudnn_packed import DOCUMENT_SLOTS, CudnnPackedBackend
from kerneltune.kernels.attention.features import MaterialisingBackend
from kerneltune.kernels.attention.jax_nn import CudnnVariantBackend
from kerneltune.kernels.attention.masking import Masks
from kerneltune.kernels.attention.mosaic_flash_api import MosaicFlashBackend
from kerneltune.kernels.attention.tokamax_backend import TokamaxVariantBackend

#: The query blocks tuning tries for the chunked path.
BLOCK_Q_CANDIDATES = (128, 256, 512, 1024)
#: Documents the tuning inputs pack a traced call's segment ids into (their count is
#: data, not shape: tuning sees an even split).
TUNING_DOCUMENTS = 4


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class VariantConfig(BackendConfig):
    """How an attention variant runs.

    Attributes:
      backend: "cudnn", "cudnn_packed", "mosaic", "tokamax", "chunked" or "xla" (see
        the module docstring).
      block_q: ("chunked", "mosaic") queries per block; a power of two ("mosaic": 64 or
        128, one or two warpgroups of 64 queries sharing the block's keys).
      block_kv: ("mosaic") keys per block; 64 or 128.

    Example:
      >>> VariantConfig(block_q=256)  # backend="chunked", the default
      VariantConfig(block_q=256)
      >>> VariantConfig(backend="cudnn")
      VariantConfig(backend='cudnn')
    """

    backend: str = "chunked"
    block_q: int | None = None
    block_kv: int | None = None

    backend_fields: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "cudnn": {},
        "cudnn_packed": {},
        "mosaic": {"block_q": 64, "block_kv": 64},
        "tokamax": {},
        "chunked": {"block_q": 512},
        "xla": {},
    }

    def check(self) -> None:
        b = self.block_q
        if b is not None and (
            isinstance(b, bool) or not isinstance(b, int) or b <= 0 or b & (b - 1)
        ):
            raise ValueError(f"VariantConfig.block_q must be a positive power of two, got {b!r}.")
        if self.backend == "mosaic" and b not in (None, 64, 128):
            raise ValueError(
                f"VariantConfig.block_q must be 64 or 128 with backend='mosaic' (one or two "
                f"warpgroups of 64 queries), got {b!r}."
            )
        if self.block_kv is not None and self.block_kv not in (64, 128):
            raise ValueError(f"VariantConfig.block_kv must be 64 or 128, got {self.block_kv!r}.")


def _logits_bytes(inv: Invocation[Any, Any], rows: int | None = None) -> int:
    """float32 logits of `rows` queries (all of them by default) against the keys."""
    q, k = inv.args[0], inv.args[1]
    b, t, n, _ = q.shape
    return 4 * b * n * (t if rows is None else rows) * int(k.shape[1])


def chunked_block_q(inv: Invocation[Any, Any], budget: int = BLOCK_LOGITS_BYTES) -> int:
    """The largest block of queries (16 to 1024) whose logits fit `budget`."""
    return default_block_q(
        inv.args[0], inv.args[1], inv.kwargs["window"], inv.kwargs["causal"], budget
    )


def whole_logits_are_one_block(inv: Invocation[Any, Any], budget: int = BLOCK_LOGITS_BYTES) -> bool:
    """Whether the chunked path's block of queries (within `budget`) spans the whole
    sequence: only then may the "xla" backend hold the whole logits, which are then no
    more than that one block. Past it a variant never holds the `[B, N, T, S]` logits
    (SPEC §8c), wherever they would fit."""
    t = int(inv.args[0].shape[1])
    return t <= chunked_block_q(inv, budget) and t <= max(BLOCK_Q_CANDIDATES)


#: Tokens from which the heuristic gives segment ids to cuDNN's packed layout: on an
#: H200 (BENCHMARKS.md, 2026-11-27, twentieth session) at 8k and 16k tokens with 4 and
#: 16 documents its training step took 0.19-0.41x the time of the best library given
#: the dense mask (tokamax), its forward 0.10-0.50x. Shorter calls are not measured.
PACKED_MIN_TOKENS = 8192

#: Tokens from which the forward alone with segment ids goes to cuDNN's packed layout
#: rather than kerneltune's Mosaic kernel (where it runs). On an H200 (BENCHMARKS.md,
#: 2026-11-29, thirty-fourth session; 16/4 heads, 2, 4 and 16 documents) the kernel's
#: forward took 0.11-0.41 ms at 8k tokens where the packed layout's took 0.30-0.64 ms,
#: varying twofold between runs; at 16k the packed layout was faster with 2 and 4
#: documents (1.00 and 0.55 ms against 1.42 and 0.74), at 32k with every count.
#: Below 8k not measured: the kernel's blocks skip other documents there as well,
#: where the libraries (the alternative) read every block.
PACKED_FORWARD_MIN_TOKENS = 16384

#: Tokens from which a causal forward with sequence lengths (padding) alone goes to
#: tokamax rather than cuDNN, where tokamax runs. On an H200 (BENCHMARKS.md, 2026-11-29,
#: 70% of T valid) tokamax's forward took 0.95x cuDNN's time at B2 32/8 heads and
#: 0.93-0.95x at B1 16/4 at 16k tokens (two runs each), 0.94x at B2 32/8 at 32k, and
#: 1.01-1.07x at 8k; in training cuDNN's step is 3-4x faster (tokamax's backward), so
#: training keeps cuDNN.
TOKAMAX_PADDED_FORWARD_MIN_TOKENS = 16384

#: Tokens from which a causal forward with a local window alone goes to tokamax rather
#: than cuDNN, where tokamax runs. With a window of 4096 keys tokamax's forward took
#: 0.97x cuDNN's time at 32k tokens on an H100 (B1 16/4 heads, two runs: 1.87 against
#: 1.92 ms, 1.85 against 1.90; BENCHMARKS.md, 2026-12-06) and 0.98x on an H200 (B2 32/8,
#: 2026-11-29), but 1.08x at 16k and 1.00-1.27x at 8k; cuDNN's windowed forward grows
#: faster than the tokens do (2.15-2.4x per doubling against tokamax's 1.94-2.0x). In
#: training cuDNN's step is 2.4-7.5x faster, so training keeps cuDNN.
TOKAMAX_WINDOW_FORWARD_MIN_TOKENS = 32768

#: The most extra memory the packed layout's backward may take for the heuristic to
#: choose it in training (`packed_backward_bytes`): on that H200 its training program
#: held 2.24 GiB against tokamax's 0.25 at 8k tokens and 4.60 against 0.75 at 16k.
PACKED_BACKWARD_BYTES = 4 * 2**30


#: On a CPU, the chunked path's most queries per block, and fewer down to
#: `CPU_MIN_BLOCK_Q` while a block's float32 logits exceed `CPU_BLOCK_LOGITS_BYTES`:
#: a block's logits then stay in the caches, where XLA's whole logits do not. On this
#: project's 2-core CPU (BENCHMARKS.md, 2026-12-08; causal, padding or a window, 8/2,
#: 8/8 and 16/4 heads) blocks of 128 queries took 0.35-0.6x the whole logits' training
#: step at 1024 tokens (4 MiB a block with 8 heads), and their forward 0.45-0.85x; at
#: 2048 tokens with 8 key heads blocks of 64 (4 MiB) took 0.63x the training step of
#: blocks of 128 (8 MiB).
CPU_BLOCK_Q = 128
CPU_MIN_BLOCK_Q = 32
CPU_BLOCK_LOGITS_BYTES = 4 << 20

#: On a CPU, the most float32 logits kept whole where one block holds them: in a forward
#: alone, and in training where every query head has its own key head. At 512 tokens, 8
#: heads (8 MiB) the whole logits' forward took 0.55x blocks of 128's, and with 8 key
#: heads its training step 0.7x; with 16 heads (16 MiB) 1.4x and 2.2x. Grouped-query
#: training is the exception: at 512 tokens with 2 key heads the whole logits' step took
#: 2x the blocks' (its backward sums the groups over the whole logits).
CPU_WHOLE_LOGITS_BYTES = 8 << 20


def cpu_config(inv: Invocation[Any, Any]) -> VariantConfig:
    """The XLA code a CPU runs the call with: the whole logits for a sequence of one
    `CPU_BLOCK_Q` block, and where they are `CPU_WHOLE_LOGITS_BYTES` or fewer and one
    block, unless grouped-query heads are trained; else blocks of `CPU_BLOCK_Q` queries
    or fewer (`CPU_BLOCK_LOGITS_BYTES`, and the chunked path's budget)."""
    q, k = inv.args[0], inv.args[1]
    t = int(q.shape[1])
    grouped_training = bool(inv.differentiated) and int(k.shape[2]) != int(q.shape[2])
    small = _logits_bytes(inv) <= CPU_WHOLE_LOGITS_BYTES and not grouped_training
    if t <= CPU_BLOCK_Q or (small and whole_logits_are_one_block(inv)):
        return VariantConfig(backend="xla")
    block_q = min(CPU_BLOCK_Q, chunked_block_q(inv))
    while block_q > CPU_MIN_BLOCK_Q and _logits_bytes(inv, block_q) > CPU_BLOCK_LOGITS_BYTES:
        block_q //= 2
    return VariantConfig(backend="chunked", block_q=block_q)


def packed_backward_bytes(inv: Invocation[Any, Any]) -> int:
    """The packed layout's backward's extra memory: float32 buffers of every query head
    for each of its `DOCUMENT_SLOTS` segment slots, two of them (2.0 and 3.85 GiB
    measured over tokamax's at 8k and 16k tokens, 16 heads of 128)."""
    b, t, n, d = inv.args[0].shape
    return 2 * DOCUMENT_SLOTS * b * t * n * d * 4


def tokamax_untrusted(inv: Invocation[Any, Any]) -> str | None:
    """Why the heuristic and tuning leave tokamax out of a training call, or None: its
    backward given a mask (segment ids go in as one) returned wrong gradients in some
    runs (`tokamax_backend.trusted_gradients`), which runs in its place."""
    if inv.differentiated and inv.args[4].has_mask:
        return (
            "tokamax's backward given a mask returned wrong key gradients in 2-4 of 6 runs "
            "(a race; tokamax 0.0.17, H200): in training its calls run cuDNN or XLA"
        )
    return None


class AttentionVariants(BackendKernel[VariantConfig]):
    """Attention with any of bias, mask, sequence lengths, segment ids, a local window
    and a soft cap: `(q, k, v, bias, masks)` with `masks` a `masking.Masks`, keyword
    arguments `causal`, `sm_scale`, `window` (a `(left, right)` pair or None) and
    `soft_cap`. The public `attention` function builds the call.
    """

    op_id = "attention_variants"
    version = "1"
    config_type = VariantConfig
    tunes_training_apart = True
    backends = (
        CudnnVariantBackend(),
        CudnnPackedBackend(),
        MosaicFlashBackend(),
        TokamaxVariantBackend(),
        ChunkedBackend(),
        MaterialisingBackend(),
    )
    fallback = "chunked"

    @staticmethod
    def args_from_record(args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A recorded call's arguments with the masks a `Masks` again (a manifest keeps
        them as a plain tuple: tuning a manifest's variant call failed on it)."""
        q, k, v, bias, masks = args
        return q, k, v, bias, Masks(*masks)

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> VariantConfig:
        """Segment ids in training, and in the forward alone below
        `PACKED_FORWARD_MIN_TOKENS` tokens: kerneltune's Mosaic kernel where it runs,
        which skips other documents' blocks forward and backward in the memory of plain
        attention. On an H200 at 8k-32k tokens (B1, 16/4 heads; BENCHMARKS.md,
        2026-11-29) its training step took 0.28-0.29x tokamax's given the dense mask
        with 4 documents and 0.08-0.11x with 16 (tokamax's gradients race; cuDNN's
        took 5-22x ours), holding 0.13-0.51 GiB where cuDNN's packed layout held
        2.30-10.69 GiB for a step 0.95-2.6x as long. Segment ids otherwise: cuDNN's
        packed layout from `PACKED_MIN_TOKENS` tokens where it runs (ids it cannot
        express run `library_cfg`'s choice, decided at run time) and, in training, its
        backward's extra memory is within `PACKED_BACKWARD_BYTES`. Else `library_cfg`."""
        packed = self.backend_named("cudnn_packed")
        segments = inv.args[4].q_segments is not None
        tokens = int(inv.args[0].shape[1])
        short = tokens < PACKED_FORWARD_MIN_TOKENS
        if segments and (inv.differentiated or short) and self.mosaic_runs(inv):
            return VariantConfig(backend="mosaic")
        if (
            tokens >= PACKED_MIN_TOKENS
            and (not inv.differentiated or packed_backward_bytes(inv) <= PACKED_BACKWARD_BYTES)
            and packed.unusable(self, inv, None) is None
        ):
            return VariantConfig(backend="cudnn_packed")
        return self.library_cfg(inv)

    def mosaic_runs(self, inv: Invocation[Any, Any]) -> bool:
        """Whether kerneltune's Mosaic kernel runs the call on the device (never chosen
        in the interpreter, which is for tests)."""
        if self.use_interpreter():
            return False
        return self.backend_named("mosaic").unusable(self, inv, None) is None

    def library_cfg(self, inv: Invocation[Any, Any]) -> VariantConfig:
        """tokamax for a soft cap, a bias, a mask or segment ids, and for a long causal
        forward with sequence lengths or a window alone (`_tokamax_long_forward`), else
        cuDNN, where they run; a soft cap without tokamax, or a call neither library
        takes, on kerneltune's Mosaic kernel where it runs; else XLA (on a CPU
        `cpu_config`'s): whole when the sequence is one block of queries, a block of
        queries at a time when not. On an H200 at 8k-32k tokens
        (BENCHMARKS.md, 2026-11-27) tokamax's training step took 0.58-0.71x cuDNN's
        time with a bias or a mask and is the only library with a soft cap; cuDNN's
        took 0.25-0.33x tokamax's with a window or padding; kerneltune's Mosaic kernel
        took 1.7x tokamax's with a soft cap, 2.2x cuDNN's with a window (2026-11-29),
        far less than XLA's paths. In training with a mask or segment ids tokamax is
        left out: its backward given a mask returned wrong gradients in some runs
        (`tokamax_backend.trusted_gradients`)."""
        usable = {
            name: self.backend_named(name).unusable(self, inv, None) is None
            for name in ("cudnn", "tokamax")
        }
        _, _, _, bias, masks = inv.args
        dense = bias is not None or masks.has_mask
        soft_cap = inv.kwargs["soft_cap"] is not None
        if tokamax_untrusted(inv):  # its backend would run cuDNN or the chunked path
            usable["tokamax"] = False
        if usable["tokamax"] and (dense or soft_cap or self._tokamax_long_forward(inv)):
            return VariantConfig(backend="tokamax")
        if usable["cudnn"]:  # never with a soft cap: those reach the Mosaic kernel below
            return VariantConfig(backend="cudnn")
        if usable["tokamax"]:
            return VariantConfig(backend="tokamax")
        if self.mosaic_runs(inv):
            return VariantConfig(backend="mosaic")
        if devices.device_kind() == "cpu":
            return cpu_config(inv)
        if whole_logits_are_one_block(inv):
            return VariantConfig(backend="xla")
        return VariantConfig(backend="chunked", block_q=chunked_block_q(inv))

    @staticmethod
    def _tokamax_long_forward(inv: Invocation[Any, Any]) -> bool:
        """A causal forward alone whose only feature is sequence lengths, from
        `TOKAMAX_PADDED_FORWARD_MIN_TOKENS` tokens, or a window alone, from
        `TOKAMAX_WINDOW_FORWARD_MIN_TOKENS` (where tokamax's forward measured faster
        than cuDNN's)."""
        masks = inv.args[4]
        lengths = masks.q_lengths is not None or masks.kv_lengths is not None
        window = inv.kwargs["window"]
        tokens = int(inv.args[0].shape[1])
        if inv.differentiated or not inv.kwargs["causal"]:
            return False
        if window is None:
            return lengths and tokens >= TOKAMAX_PADDED_FORWARD_MIN_TOKENS
        return not lengths and tokens >= TOKAMAX_WINDOW_FORWARD_MIN_TOKENS

    def search_space(self, inv: Invocation[Any, Any]):
        """Where the heuristic picks cuDNN, its packed layout, tokamax or kerneltune's
        Mosaic kernel (at its default blocks), that config alone; for the libraries:
        on an H200 at 8k-32k tokens (BENCHMARKS.md, 2026-11-27) the other library's
        training step took 1.4-1.7x as long with a bias, a mask or segment ids and 3-4x
        with a window or padding, and XLA's paths 8-16x, while timing them made the
        first call 5-8 s longer (tokamax compiles for 7-8 s); for the Mosaic kernel, two
        warpgroups a block (`block_q=128`) ran no faster than one (H200, 2026-11-29).
        Elsewhere the whole logits where the sequence is one block, and the chunked
        path's query blocks."""
        libraries = [VariantConfig(backend="cudnn"), VariantConfig(backend="tokamax")]
        runs = [
            c for c in libraries if self.backend_named(c.backend).unusable(self, inv, c) is None
        ]
        packed = VariantConfig(backend="cudnn_packed")  # chosen only by the heuristic
        xla = [VariantConfig(backend="xla")] + [
            VariantConfig(backend="chunked", block_q=bq) for bq in BLOCK_Q_CANDIDATES
        ]
        chosen = self.heuristic_cfg(inv)

        def untrusted(c: VariantConfig) -> str | None:
            return tokamax_untrusted(inv) if c.backend == "tokamax" else None

        mosaic = VariantConfig(backend="mosaic")
        if chosen.backend in ("cudnn", "cudnn_packed", "tokamax", "mosaic"):
            why = {
                "cudnn_packed": "cuDNN's packed layout runs these documents; the libraries "
                "given the dense mask measured 2.4-5x slower (H200, 8k-16k tokens)",
                "mosaic": "kerneltune's Mosaic kernel runs this call; XLA's paths, the "
                "libraries given a dense mask and, in the forward below 16k tokens, cuDNN's "
                "packed layout measured slower (H200, 8k-16k tokens)",
            }.get(
                chosen.backend,
                f"{chosen.backend} runs this variant; the other library measured 1.4-4x "
                "slower, kerneltune's Mosaic kernel 1.7-2.2x and XLA's paths 8-16x (H200, "
                "8k-32k tokens)",
            )
            if chosen.backend == "tokamax" and self._tokamax_long_forward(inv):
                why = (
                    "tokamax runs this long causal forward with lengths; cuDNN's forward "
                    "measured 1.05-1.08x its time and XLA's paths far slower (H200, 16k-32k "
                    "tokens)"
                    if inv.kwargs["window"] is None
                    else "tokamax runs this long causal forward with a window; cuDNN's "
                    "forward measured 1.02-1.03x its time and XLA's paths far slower (H100, "
                    "H200, 32k tokens)"
                )
            others = [c for c in [*libraries, packed, mosaic, *xla] if c != chosen]
            return [chosen], [Pruned(c, untrusted(c) or why) for c in others]
        kept: list[VariantConfig] = []
        pruned: list[Pruned[VariantConfig]] = []
        longest = max(16, next_power_of_2(int(inv.args[0].shape[1])))
        for c in xla:
            if c.backend == "xla" and not whole_logits_are_one_block(inv, 4 * BLOCK_LOGITS_BYTES):
                why = (
                    f"the whole logits ({_logits_bytes(inv) / 2**30:.2f} GiB) are more than "
                    "one block of queries: variants never hold them"
                )
                pruned.append(Pruned(c, why))
            elif (
                c.backend == "chunked"
                and c.block_q is not None
                and (c.block_q > longest or _logits_bytes(inv, c.block_q) > 4 * BLOCK_LOGITS_BYTES)
            ):
                pruned.append(Pruned(c, "a block beyond the sequence or the memory budget"))
            else:
                kept.append(c)
        pruned += [Pruned(c, reason) for c in runs if (reason := untrusted(c))]
        return kept, pruned

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[VariantConfig]:
        return [VariantConfig(backend="xla"), VariantConfig(backend="chunked", block_q=16)]

    def reference(self, q, k, v, bias, masks, *, causal, sm_scale, window, soft_cap):
        """The variant's math a block of queries at a time (it fits where the call does)."""
        return attention_chunked(
            q, k, v, bias, masks, scale=sm_scale, causal=causal, window=window,
            soft_cap=soft_cap,
        )  # fmt: skip

    def tuning_inputs(self, inv: Invocation[Any, Any]):
        """Random queries, keys, values and bias; a traced mask lets every logit take
        part, traced lengths are full and traced segment ids split the sequence into
        `TUNING_DOCUMENTS` even documents (their real count is data)."""
        q, k, v, bias, masks = inv.args
        seed = keys.seed_of(inv.call_key)
        q, k, v, bias = random_like((q, k, v, bias), seed=seed)
        b, t = q.shape[0], q.shape[1]
        s = k.shape[1]

        def even_documents(length: int) -> Any:
            docs = np.arange(length) * TUNING_DOCUMENTS // max(length, 1)
            return jnp.broadcast_to(jnp.asarray(docs, jnp.int32), (b, length))

        masks = Masks(
            mask=None if masks.mask is None else jnp.ones(masks.mask.shape, bool),
            q_lengths=None if masks.q_lengths is None else jnp.full((b,), t, jnp.int32),
            kv_lengths=None if masks.kv_lengths is None else jnp.full((b,), s, jnp.int32),
            q_segments=None if masks.q_segments is None else even_documents(t),
            kv_segments=None if masks.kv_segments is None else even_documents(s),
        )
        return (q, k, v, bias, masks), dict(inv.kwargs)
