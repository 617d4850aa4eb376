"""Each row's log-sum-exp and label logit of logits already written, in one Pallas
pass lowered through Triton on GPUs.

The chunked backend's matmul (cuBLAS) writes a chunk's `[rows, V]` logits; this kernel
reads them once and folds each row into a running maximum, the sum of
`exp(logit − maximum)` and the label's logit (`lse_xla.RowStats`). XLA's reduction of
the same (`lse_xla`) is bound by its exponentials: two per logit, in the pairwise
combiner a variadic reduction needs. Here each logit costs one exponential and each
block of columns one more per row, so the pass is bound by reading memory.

Each program owns `block_m` rows and walks the vocabulary in blocks of `block_v`
columns. Columns past the last whole block (a 128256 vocabulary is 62 blocks of 2048
and 1280 more) are folded in by XLA's reduction and combined: padding the logits to
whole blocks would copy them, which costs more than the pass.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kerneltune.kernels._common import launch_params
from kerneltune.kernels.cross_entropy import lse_xla


@dataclasses.dataclass(frozen=True)
class LseTiles:
    """One program's rows, the columns of each step, and Triton's launch knobs."""

    block_m: int = 1
    block_v: int = 2048
    num_warps: int = 4
    num_stages: int = 2


#: One row a program, 2048 columns a step, 4 warps: on an H100 within 1% of the fastest
#: of 32 tiles at each of 8192 × {32000, 128256, 256000} and 2048 × 128256 bf16 logits,
#: 87% of one read's time at 8192 × 128256 (0.84 ms; XLA's reduction 1.53 ms), with
#: `benchmarks/lse_pass_gpu.py`. Rows of 4 or 8 were 1.2–1.5× slower.
DEFAULT_TILES = LseTiles()
#: The narrowest block of columns a program steps by.
MIN_BLOCK_V = 16


def tiles_for(vocab: int) -> LseTiles | None:
    """`DEFAULT_TILES`, with blocks of columns no wider than `vocab` (a power of two);
    None where the vocabulary is narrower than `MIN_BLOCK_V`."""
    if vocab < MIN_BLOCK_V:
        return None
    block_v = min(DEFAULT_TILES.block_v, 1 << (vocab.bit_length() - 1))
    return dataclasses.replace(DEFAULT_TILES, block_v=block_v)


def fits(rows: int, vocab: int, tiles: LseTiles) -> bool:
    """True when the kernel takes `[rows, vocab]` logits with `tiles`: whole programs
    of rows and at least one block of columns."""
    return rows % tiles.block_m == 0 and vocab >= tiles.block_v


def tiles_taking(rows: int, vocab: int) -> LseTiles | None:
    """`tiles_for(vocab)` where they fit `[rows, vocab]` logits, else None (the caller
    then takes XLA's reduction)."""
    tiles = tiles_for(vocab)
    return tiles if tiles is not None and fits(rows, vocab, tiles) else None


def empty_stats(rows: int) -> lse_xla.RowStats:
    """Row stats before any column: a maximum of -inf, a sum and a label logit of 0."""
    zeros = jnp.zeros((rows,), jnp.float32)
    return jnp.full((rows,), -jnp.inf, jnp.float32), zeros, zeros


def _shift(running_max: jax.Array) -> jax.Array:
    """What a row's exponentials are taken relative to: its maximum where finite, else
    0 (a row of -inf sums to 0 and a row holding +inf to +inf, where `logit − maximum`
    would be NaN)."""
    return jnp.where(jnp.isfinite(running_max), running_max, 0.0)


def fold_tile(
    stats: lse_xla.RowStats, tile: jax.Array, cols: jax.Array, labels: jax.Array
) -> lse_xla.RowStats:
    """`stats` with a float32 `[rows, block]` tile of logits folded in (an online
    log-sum-exp: one exponential a logit, one more a row to rescale the sum); `cols`
    are the tile's column numbers, `labels` each row's label. Shared with the fused
    kernel (`pallas_triton`)."""
    running_max, running_sum, picked = stats
    new_max = jnp.maximum(running_max, jnp.max(tile, axis=1))
    shift = _shift(new_max)
    running_sum = running_sum * jnp.exp(_shift(running_max) - shift) + jnp.sum(
        jnp.exp(tile - shift[:, None]), axis=1
    )
    picked = picked + jnp.sum(jnp.where(cols == labels[:, None], tile, 0.0), axis=1)
    return new_max, running_sum, picked


def finish(running_max: jax.Array, running_sum: jax.Array) -> jax.Array:
    """Each row's log-sum-exp from its folded maximum and sum: an infinite maximum is
    the log-sum-exp itself (its sum was taken relative to 0)."""
    return jnp.where(jnp.isfinite(running_max), running_max + jnp.log(running_sum), running_max)


def _kernel(logits_ref, labels_ref, max_ref, sum_ref, picked_ref, *, block_v: int, v_steps: int):
    labels = labels_ref[...]

    def step(j, stats):
        v0 = pl.multiple_of(j * block_v, block_v)
        tile = logits_ref[:, pl.ds(v0, block_v)].astype(jnp.float32)
        cols = v0 + lax.broadcasted_iota(jnp.int32, tile.shape, 1)
        return fold_tile(stats, tile, cols, labels)

    stats = lax.fori_loop(0, v_steps, step, empty_stats(logits_ref.shape[0]))
    max_ref[...], sum_ref[...], picked_ref[...] = stats


def _whole_blocks(
    logits: jax.Array, labels: jax.Array, tiles: LseTiles, v_steps: int, interpret: bool
) -> lse_xla.RowStats:
    """The stats of the first `v_steps` blocks of columns; the sum is relative to the
    maximum where it is finite, to 0 where it is not."""
    rows, vocab = logits.shape
    kernel = functools.partial(_kernel, block_v=tiles.block_v, v_steps=v_steps)
    row = jax.ShapeDtypeStruct((rows,), jnp.float32)
    row_block = pl.BlockSpec((tiles.block_m,), lambda i: (i,))
    return pl.pallas_call(  # type: ignore[no-any-return]
        kernel,
        out_shape=(row, row, row),
        grid=(rows // tiles.block_m,),
        in_specs=[pl.BlockSpec((tiles.block_m, vocab), lambda i: (i, 0)), row_block],
        out_specs=(row_block, row_block, row_block),
        compiler_params=launch_params(tiles, interpret=interpret),
        interpret=interpret,
        name="kerneltune_logits_lse",
    )(logits, labels)


def lse_and_label_logit(
    logits: jax.Array,
    labels: jax.Array,
    tiles: LseTiles | None = None,
    *,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Each row's float32 `logsumexp` and label logit of 2-D `logits` (any floating
    dtype, read as written), as `lse_xla.lse_and_label_logit` computes them (labels
    picked as `lse_xla.clip_labels` says); `tiles` default to `tiles_for(V)`.

    Raises:
      ValueError: the kernel does not take the logits' shape (see `fits`).
    """
    rows, vocab = logits.shape
    tiles = tiles or tiles_for(vocab)
    if tiles is None or not fits(rows, vocab, tiles):
        raise ValueError(
            f"lse_and_label_logit: logits of shape {list(logits.shape)} do not fit the "
            f"tiles {tiles} (rows a multiple of block_m, at least block_v columns, at "
            f"least {MIN_BLOCK_V})."
        )
    labels = lse_xla.clip_labels(labels, vocab)
    v_steps = vocab // tiles.block_v
    stats = _whole_blocks(logits, labels, tiles, v_steps, interpret)
    done = v_steps * tiles.block_v
    if done < vocab:
        tail = lse_xla.row_stats(lax.slice_in_dim(logits, done, vocab, axis=1), labels, done)
        stats = lse_xla.combine(stats, tail)
    mx, total, picked = stats
    return finish(mx, total), picked
