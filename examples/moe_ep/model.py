"""The mixture-of-experts block of `examples/moe/model.py`, expert-parallel.

A mesh has an expert axis (`EP` devices; each holds `G_local = experts / EP` experts:
the gate, up and down weights are sharded over it) and a data axis; tokens are split
over both. One `shard_map` over the mesh runs, on every device: the router and top-k
for its tokens, the dispatch of the routed copies to the devices that hold their
experts, the local experts' SwiGLU through `ragged_dot` (three grouped matmuls), the
return of the results and the weighted combine. JAX differentiates all of it (the
collectives transpose into their opposites). The block is written once against an ops
namespace (`examples/moe/model.py`), so the same code runs on `jax.lax.ragged_dot`,
tokamax's and kerneltune's.

Three dispatches (`EPConfig.dispatch`):

- `"ragged"`: `jax.lax.ragged_all_to_all` sends each device exactly the rows for its
  experts (sizes exchanged first with an `all_to_all` of the per-expert counts); the
  receiver sorts what arrived by its local experts and runs the local groups,
  renumbered from 0 (no `group_offset`). XLA lowers `ragged-all-to-all` on GPUs; XLA:CPU
  does not ("HLO opcode `ragged-all-to-all` is not supported by XLA:CPU", jax 0.10.2).
- `"dense"`: `jax.lax.all_to_all` with a fixed capacity of rows per pair of devices
  (the GShard layout): the same bookkeeping with every chunk padded to the capacity.
  Runs on every platform (the CPU tests use it).
- `"gather"`: the tokens are gathered over the expert axis (`all_gather`), every device
  of the axis routes all of them, so the rows are sorted by *global* expert with the
  global group sizes, and its local experts' rows are computed by
  `ragged_dot(..., group_offset=axis_index * G_local)`; the other rows are zero, and a
  `psum_scatter` sums each token's outputs back onto the device it came from. On
  `jax.lax.ragged_dot` and tokamax (which take no `group_offset`) the namespace
  renumbers the groups (`model.ragged_dot_at`).

`"auto"` (the default) is `"dense"`. On GPUs XLA's kernel for `ragged-all-to-all` is
slow (an H200, jax 0.11.2, BENCHMARKS.md): at 1 GPU the fine block's three calls took
48 ms each, at 2 GPUs 24 ms each on each GPU, where `"dense"`'s `all_to_all` makes the
whole training step 6.2-6.5 ms (`"ragged"`: 151 and 79 ms).

`capacity_factor`: rows a device can receive, as a multiple of the rows it routes
(`tokens × top_k`); None (the default) takes the worst case (every row of every device
of the axis to one device), so no row is ever dropped and the block equals the
unsharded one. With a factor, rows past a device's capacity are dropped (their expert
output is zero), as in capacity-based MoE training.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from examples.moe import model as moe

Dispatch = Literal["auto", "ragged", "dense", "gather"]
DISPATCHES = ("auto", "ragged", "dense", "gather")


@dataclasses.dataclass(frozen=True)
class EPConfig:
    """How the block is laid out over the mesh.

    Attributes:
      data: the mesh axis the tokens are split over besides `expert` (None: none).
      expert: the mesh axis the experts are split over.
      dispatch: "auto", "ragged", "dense" or "gather" (the module's docstring).
      capacity_factor: rows a device receives at most, as a multiple of the rows it
        routes; None: no limit (nothing dropped).
    """

    data: str | None = "data"
    expert: str = "expert"
    dispatch: Dispatch = "auto"
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCHES:
            raise ValueError(
                f"EPConfig.dispatch must be one of {DISPATCHES}, got {self.dispatch!r}."
            )
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(
                f"EPConfig.capacity_factor must be None or positive, got {self.capacity_factor!r}."
            )

    @property
    def token_axes(self) -> tuple[str, ...]:
        return (self.data, self.expert) if self.data else (self.expert,)


def make_mesh(expert: int, data: int = 1, devices: Any = None, cfg: EPConfig = EPConfig()) -> Mesh:
    """A `(data, expert)` mesh over the first `data * expert` devices (all processes'
    devices under `jax.distributed`)."""
    devices = jax.devices() if devices is None else devices
    if data * expert > len(devices):
        raise ValueError(
            f"a {data} x {expert} mesh needs {data * expert} devices; there are {len(devices)}."
        )
    grid = np.asarray(devices[: data * expert]).reshape(data, expert)
    if cfg.data is None:
        if data != 1:
            raise ValueError(f"EPConfig.data is None: the mesh has no data axis, got data={data}.")
        return Mesh(grid[0], (cfg.expert,))
    return Mesh(grid, (cfg.data, cfg.expert))


def param_specs(cfg: EPConfig) -> dict[str, P]:
    """The router is replicated; each expert weight is split over the expert axis."""
    return {"router": P(), "gate": P(cfg.expert), "up": P(cfg.expert), "down": P(cfg.expert)}


def shard(mesh: Mesh, cfg: EPConfig, params: dict[str, Any], *tokens: Any) -> tuple[Any, ...]:
    """`params` and token arrays (`[T, ...]`) placed on the mesh: the layout
    `ep_moe_block` takes. Works with one process or many (each builds the same global
    values; every process keeps the shards of its own devices)."""

    def put(x: Any, spec: P) -> jax.Array:
        x = np.asarray(x)
        sharding = NamedSharding(mesh, spec)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    specs = param_specs(cfg)
    placed = {k: put(v, specs[k]) for k, v in params.items()}
    return (placed, *(put(t, P(cfg.token_axes)) for t in tokens))


# --- where rows go -----------------------------------------------------------------------


def exclusive_cumsum(x: jax.Array) -> jax.Array:
    return jnp.cumsum(x) - x


@dataclasses.dataclass(frozen=True)
class Plan:
    """One device's side of a dispatch over an expert axis of `ep` devices.

    Sender side: `send[j]` rows (its routed rows for device j's experts, contiguous
    from row `send_start[j]`) go to device j, which keeps at most `sent[j]` of them.
    Receiver side: device i's rows land at `recv_start[i]` in a buffer of `capacity`
    rows, `recv[i]` of them kept, `recv_counts[i, e]` of the kept and dropped ones
    being for local expert e (in that order within the chunk).
    """

    send: jax.Array
    send_start: jax.Array
    sent: jax.Array
    recv_start: jax.Array
    recv: jax.Array
    recv_counts: jax.Array
    capacity: int


def plan(sizes: jax.Array, ep: int, axis: str, capacity: int, per_pair: bool) -> Plan:
    """The dispatch of rows sorted by expert (`sizes[experts]` of them per expert) to
    the `ep` devices of `axis`, each receiving into a buffer of `capacity` rows:
    packed one chunk after another, or (`per_pair`, the dense all-to-all) in slots of
    `capacity // ep` rows, one per sender."""
    counts = sizes.reshape(ep, -1)  # [peer, its local expert]
    send = counts.sum(axis=1)
    recv_counts = jax.lax.all_to_all(counts, axis, 0, 0, tiled=True)  # [sender, my expert]
    total = recv_counts.sum(axis=1)
    if per_pair:
        slot = capacity // ep
        recv_start = jnp.arange(ep, dtype=jnp.int32) * slot
        recv = jnp.minimum(total, slot)
    else:
        recv_start = exclusive_cumsum(total)
        recv = jnp.clip(capacity - recv_start, 0, total)
    sent = jax.lax.all_to_all(recv, axis, 0, 0, tiled=True)
    return Plan(send, exclusive_cumsum(send), sent, recv_start, recv, recv_counts, capacity)


def local_expert_of_rows(pl: Plan, local: int) -> jax.Array:
    """For each row of the receive buffer, the local expert it is for (`local` for a
    row nobody sent)."""
    rows = jnp.arange(pl.capacity, dtype=jnp.int32)
    ends = pl.recv_start + pl.recv
    sender = jnp.clip(jnp.searchsorted(pl.recv_start, rows, side="right") - 1, 0)
    kept = rows < ends[sender]
    within = rows - pl.recv_start[sender]
    bounds = jnp.cumsum(pl.recv_counts, axis=1)[sender]  # [capacity, local]
    expert = jnp.sum(within[:, None] >= bounds, axis=1)
    return jnp.where(kept, expert, local).astype(jnp.int32)


# --- the transports --------------------------------------------------------------------


RaggedAllToAll = Callable[..., jax.Array]


def send_ragged(
    rows: jax.Array, pl: Plan, axis: str, ragged_all_to_all: RaggedAllToAll
) -> jax.Array:
    """`rows` (sorted by expert) to the devices of their experts: `[capacity, D]`."""
    out_start = jax.lax.all_to_all(pl.recv_start, axis, 0, 0, tiled=True)
    buffer = jnp.zeros((pl.capacity, rows.shape[1]), rows.dtype)
    return ragged_all_to_all(
        rows, buffer, pl.send_start, pl.sent, out_start, pl.recv, axis_name=axis
    )


def return_ragged(
    out: jax.Array, pl: Plan, n: int, axis: str, ragged_all_to_all: RaggedAllToAll
) -> jax.Array:
    """The receive buffer's results back to their `n` rows on the senders."""
    back_start = jax.lax.all_to_all(pl.send_start, axis, 0, 0, tiled=True)
    buffer = jnp.zeros((n, out.shape[1]), out.dtype)
    return ragged_all_to_all(
        out, buffer, pl.recv_start, pl.recv, back_start, pl.sent, axis_name=axis
    )


def send_dense(rows: jax.Array, pl: Plan, ep: int, axis: str) -> jax.Array:
    """`rows` to the devices of their experts in slots of `capacity // ep` rows per
    sender (`all_to_all`): `[capacity, D]`."""
    slot = pl.capacity // ep
    c = jnp.arange(slot, dtype=jnp.int32)
    index = pl.send_start[:, None] + c[None, :]  # [peer, slot]
    keep = c[None, :] < pl.sent[:, None]
    packed = jnp.where(keep[..., None], rows[jnp.clip(index, 0, rows.shape[0] - 1)], 0)
    got = jax.lax.all_to_all(packed.astype(rows.dtype), axis, 0, 0, tiled=True)
    return got.reshape(pl.capacity, rows.shape[1])


def return_dense(out: jax.Array, pl: Plan, n: int, ep: int, axis: str) -> jax.Array:
    """The slots' results back to their `n` rows on the senders (zeros for dropped
    rows).

    Each row fetches its own slot (a gather): row `r` went to the peer `j` whose chunk
    holds it, at position `r - send_start[j]` of that peer's slot. Writing the slots
    into the rows instead (`.at[target].set`, the dropped slots all aimed at one row)
    made the backward build a `[rows, D]` mask of which update won: on the fine block's
    1-GPU step a 32768 x 2048 scatter and gather of integers."""
    slot = pl.capacity // ep
    back = jax.lax.all_to_all(out.reshape(ep, slot, out.shape[1]), axis, 0, 0, tiled=True)
    flat = back.reshape(ep * slot, out.shape[1])
    rows = jnp.arange(n, dtype=jnp.int32)
    peer = jnp.clip(jnp.searchsorted(pl.send_start, rows, side="right") - 1, 0, ep - 1)
    within = rows - pl.send_start[peer]
    kept = within < pl.sent[peer]
    index = jnp.where(kept, peer * slot + within, 0)
    return jnp.where(kept[:, None], flat[index], 0)


# --- the block ---------------------------------------------------------------------------


def capacity_of(rows_per_device: int, ep: int, cfg: EPConfig, dispatch: str) -> int:
    """Receive-buffer rows: the worst case without a capacity factor, else
    `factor × rows routed`; a multiple of `ep` (dense slots) and of 8."""
    if cfg.capacity_factor is None:
        rows = ep * rows_per_device
    else:
        rows = math.ceil(cfg.capacity_factor * rows_per_device)
    unit = 8 * ep if dispatch == "dense" else 8
    return max(unit, -(-rows // unit) * unit)


def _local_block(
    ops: Any,
    s: moe.MoEShape,
    cfg: EPConfig,
    dispatch: str,
    ep: int,
    ragged_all_to_all: RaggedAllToAll,
    p: dict[str, jax.Array],
    x: jax.Array,
) -> jax.Array:
    """One device's part: its tokens `x[T_local, D]` in, their outputs out (float32)."""
    axis = cfg.expert
    local = p["gate"].shape[0]
    if dispatch == "gather":
        everyone = jax.lax.all_gather(x, axis, tiled=True)  # [ep * T_local, D]
        rows, token, weights, sizes = moe.route(p, everyone, s)
        offset = jax.lax.axis_index(axis) * local
        out = moe.swiglu_experts(ops, p, rows, sizes, group_offset=offset)
        y = moe.combine(out, weights, token, everyone.shape[0])
        return jax.lax.psum_scatter(y, axis, scatter_dimension=0, tiled=True)
    rows, token, weights, sizes = moe.route(p, x, s)
    n = rows.shape[0]
    capacity = capacity_of(n, ep, cfg, dispatch)
    pl = plan(sizes, ep, axis, capacity, per_pair=dispatch == "dense")
    if dispatch == "dense":
        got = send_dense(rows, pl, ep, axis)
    else:
        got = send_ragged(rows, pl, axis, ragged_all_to_all)
    expert = local_expert_of_rows(pl, local)
    order = jnp.argsort(expert, stable=True)
    local_sizes = jnp.bincount(expert, length=local + 1)[:local].astype(jnp.int32)
    # Sorting by expert and back are gathers by a permutation and its inverse: each
    # index once (`unique_indices`), so their gradients are plain scatters. Undoing the
    # sort with `.at[order].set` instead made the backward build a [rows, D] mask of
    # which update won, as for indices that may repeat.
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    rows_sorted = got.at[order].get(unique_indices=True)
    out_sorted = moe.swiglu_experts(ops, p, rows_sorted, local_sizes)
    out = out_sorted.at[inverse].get(unique_indices=True)
    if dispatch == "dense":
        back = return_dense(out, pl, n, ep, axis)
    else:
        back = return_ragged(out, pl, n, axis, ragged_all_to_all)
    return moe.combine(back, weights, token, x.shape[0])


def _shard_map(fn: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # jax < 0.7
        from jax.experimental.shard_map import shard_map
    # Pallas kernels carry no replication (varying-axes) information: the check is off.
    try:
        return shard_map(fn, check_vma=False, **kwargs)
    except TypeError:  # older spelling
        return shard_map(fn, check_rep=False, **kwargs)


def resolve(cfg: EPConfig) -> str:
    """The dispatch `"auto"` stands for, `"dense"` (the module's docstring says why);
    others as they are."""
    return "dense" if cfg.dispatch == "auto" else cfg.dispatch


def ep_moe_block(
    ops: Any,
    mesh: Mesh,
    s: moe.MoEShape,
    cfg: EPConfig = EPConfig(),
    *,
    ragged_all_to_all: RaggedAllToAll = jax.lax.ragged_all_to_all,
) -> Callable[[dict[str, jax.Array], jax.Array], jax.Array]:
    """`f(params, x)`: `moe.moe_block(ops, params, x, s)` with the experts split over
    `mesh`'s expert axis and the tokens over its axes (`shard` places them).

    Args:
      ops: the ops namespace (`moe.jax_ops()`, `moe.kerneltune_ops()`, ...).
      mesh: a mesh with `cfg.expert` (and `cfg.data`) axes; the expert axis's size
        must divide `s.experts`.
      s: the block's shape (`s.tokens` is the global batch).
      cfg: the layout and dispatch.
      ragged_all_to_all: the collective the "ragged" dispatch uses (tests give a
        stand-in with its documented semantics where XLA cannot compile it).
    """
    ep = mesh.shape[cfg.expert]
    if s.experts % ep:
        raise ValueError(
            f"the expert axis {cfg.expert!r} has {ep} devices, which must divide the "
            f"{s.experts} experts."
        )
    dispatch = resolve(cfg)
    body = functools.partial(_local_block, ops, s, cfg, dispatch, ep, ragged_all_to_all)
    tokens = P(cfg.token_axes)
    sharded = _shard_map(body, mesh=mesh, in_specs=(param_specs(cfg), tokens), out_specs=tokens)

    def block(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return sharded(p, x).astype(x.dtype)

    block.dispatch = dispatch  # type: ignore[attr-defined]
    return block


def loss_fn(block: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    def loss(p: dict[str, jax.Array], x: jax.Array, target: jax.Array) -> jax.Array:
        y = block(p, x).astype(jnp.float32)
        return jnp.mean(jnp.square(y - target.astype(jnp.float32)))

    return loss


def train_step(block: Callable[..., jax.Array], lr: float = 0.5) -> Callable[..., Any]:
    """One SGD step of the sharded block: `(params, x, target) -> (params, loss)` (the
    same update as `moe.train_step`)."""
    grad = jax.value_and_grad(loss_fn(block))

    def step(p: dict[str, jax.Array], x: jax.Array, target: jax.Array) -> Any:
        loss, g = grad(p, x, target)
        new = jax.tree.map(lambda a, b: (a - lr * b.astype(jnp.float32)).astype(a.dtype), p, g)
        return new, loss

    return step
