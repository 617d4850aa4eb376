"""Running a kernel per shard with `shard_map`, and the per-shard view used to tune it.

A call with `method="shard_map"` carries the *global* arguments; its call key includes
the mesh (axis names and sizes) and the specs, so the same global shapes split another
way get their own config. The kernel itself only ever sees one shard, so its heuristic,
its candidates and its tuning see the per-shard shapes (`per_shard_invocation`), and
tuning runs on one device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.sharding import PartitionSpec

from kerneltune._src.core import keys
from kerneltune._src.kernel import dispatch
from kerneltune._src.kernel.base import Invocation, Kernel
from kerneltune._src.kernel.recording import FixedKey


def shard_map_function(
    kernel: Kernel[Any, Any], cfg: Any, inv: Invocation[Any, Any]
) -> Callable[..., Any]:
    """`f(*args, **kwargs)` running the kernel on each shard (its `run_shard_map*`
    method when it defines one, else `run`), with `cfg` chosen for the shard shapes.
    Keyword arguments are passed to every shard as they are (static values)."""
    per_shard = dispatch.kernel_function(kernel, cfg, context="shard_map")

    def call(*args: Any, **kwargs: Any) -> Any:
        def body(*shards: Any) -> Any:
            return per_shard(*shards, **kwargs)

        return jax.shard_map(
            body,
            mesh=inv.mesh,
            in_specs=inv.in_specs,
            out_specs=inv.out_specs,
            check_vma=bool(type(kernel).shard_map_check_vma),
        )(*args)

    return call


def mesh_axis_sizes(mesh: Any) -> dict[str, int]:
    """`{axis name: size}` of a `Mesh` or `AbstractMesh`."""
    shape = getattr(mesh, "shape", None)
    if not isinstance(shape, Mapping):
        raise TypeError(
            f"expected a jax.sharding.Mesh or AbstractMesh, got {type(mesh).__qualname__}."
        )
    return {str(name): int(size) for name, size in shape.items()}


def shard_shape(shape: tuple[int, ...], spec: Any, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of one shard of an array of `shape` split by `spec` over a mesh with
    axis `sizes`.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> shard_shape((8, 6), P("x", None), {"x": 4, "y": 2})
      (2, 6)
      >>> shard_shape((8, 6), P(("x", "y")), {"x": 2, "y": 2})
      (2, 6)

    Raises:
      ValueError: the spec names an axis the mesh lacks, has more entries than the
        array has dimensions, or a dimension does not divide evenly.
    """
    out = list(shape)
    if spec is None:
        return tuple(out)
    entries = tuple(spec)
    if len(entries) > len(out):
        raise ValueError(
            f"partition spec {spec} has {len(entries)} entries for an array of shape {tuple(shape)}."
        )
    for dim, entry in enumerate(entries):
        if entry is None:
            continue
        names = tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)
        unknown = [n for n in names if n not in sizes]
        if unknown:
            raise ValueError(
                f"partition spec {spec} names mesh axes {unknown}; the mesh has {sorted(sizes)}."
            )
        factor = math.prod(sizes[n] for n in names)
        if out[dim] % factor:
            raise ValueError(
                f"dimension {dim} of an array of shape {tuple(shape)} has size {out[dim]}, "
                f"which mesh axes {names} (together {factor} shards) do not divide."
            )
        out[dim] //= factor
    return tuple(out)


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def per_shard_args(args: tuple[Any, ...], in_specs: Any, mesh: Any) -> tuple[Any, ...]:
    """`args` with every array replaced by a `ShapeDtypeStruct` of one shard's shape.
    `in_specs` is a prefix of the argument tuple, as `jax.shard_map` takes it: one
    `PartitionSpec` for every argument, or one per argument (or per array leaf)."""
    sizes = mesh_axis_sizes(mesh)

    def one(spec: Any, subtree: Any) -> Any:
        def leaf(x: Any) -> Any:
            if not keys.is_array(x):
                return x
            return jax.ShapeDtypeStruct(shard_shape(tuple(x.shape), spec, sizes), x.dtype)

        return jax.tree_util.tree_map(leaf, subtree)

    args = tuple(args)
    if _is_spec(in_specs):
        return tuple(one(in_specs, a) for a in args)
    specs = tuple(in_specs)
    if len(specs) != len(args):
        raise ValueError(f"in_specs has {len(specs)} entries for {len(args)} positional arguments.")
    return tuple(
        jax.tree_util.tree_map(one, spec, arg, is_leaf=_is_spec)
        for spec, arg in zip(specs, args, strict=True)
    )


def per_shard_invocation(inv: Invocation[Any, Any]) -> Invocation[Any, Any]:
    """The invocation one shard of a `method="shard_map"` call sees: per-shard argument
    shapes, the same call key (which covers the global shapes, the mesh and the specs)."""
    if inv.method != "shard_map":
        return inv
    shard_args = per_shard_args(inv.args, inv.in_specs, inv.mesh)
    return dataclasses.replace(inv, args=shard_args, key_builder=FixedKey(inv.call_key))
