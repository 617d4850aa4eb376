"""Which tuned calls are neighbours: the same op, dtypes and static values, other sizes.

A call's *shape* splits its key payload in two: the array dimensions (`sizes`, in
order), and everything else (`family`: a hash of the payload with every dimension
blanked out — dtypes, ranks, static arguments, batch axes, mesh). Two calls of one op
whose families match differ only in sizes; the closer their sizes on a log scale, the
likelier one's best config is good for the other. Warm start (`tuning/warm_start.py`)
starts a search from the winners of the nearest tuned neighbours.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kerneltune._src.core import codec, keys


@dataclasses.dataclass(frozen=True)
class CallShape:
    """A call's sizes and the family of calls that differ from it only in sizes.

    Attributes:
      family: a hash of the call's key payload with every array dimension blanked out.
      sizes: every array dimension of the call, in argument order.
    """

    family: str
    sizes: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "sizes": list(self.sizes)}

    @classmethod
    def from_json(cls, data: Any) -> CallShape | None:
        """The shape stored in an entry document, or None when it holds none (an entry
        written before shapes were stored) or something malformed."""
        if not isinstance(data, Mapping):
            return None
        family, sizes = data.get("family"), data.get("sizes")
        if not isinstance(family, str) or not isinstance(sizes, list):
            return None
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes):
            return None
        return cls(family, tuple(sizes))


def call_shape(payload: Any) -> CallShape | None:
    """The `CallShape` of a key payload (`Invocation.key_payload()`), or None when the
    payload cannot be encoded (a kernel with its own key builder may take values the
    codec does not know) or has symbolic dimensions."""
    try:
        data = codec.encode(payload, for_key=True)
    except TypeError:
        return None
    sizes: list[int] = []
    try:
        blanked = _blank_sizes(data, sizes)
    except _Symbolic:
        return None
    return CallShape(keys.hash_text(keys.stable_json(blanked)), tuple(sizes))


class _Symbolic(Exception):
    """A dimension without an integer value (`jax.export` shapes)."""


def _blank_sizes(data: Any, sizes: list[int]) -> Any:
    """`data` with each array's dimensions replaced by its rank, appending the
    dimensions to `sizes`."""
    if isinstance(data, list):
        return [_blank_sizes(v, sizes) for v in data]
    if not isinstance(data, dict):
        return data
    if "__array__" in data:
        dims = data["__array__"]
        if not all(isinstance(d, int) for d in dims):
            raise _Symbolic
        sizes.extend(dims)
        return {**data, "__array__": len(dims)}
    return {k: _blank_sizes(v, sizes) for k, v in data.items()}


def distance(a: Sequence[int], b: Sequence[int]) -> float:
    """How far apart two calls of one family are: the summed |log2| ratio of their
    sizes (a dimension of 0 or 1 counts as 1)."""
    return sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(a, b, strict=True))


def nearest(
    shape: CallShape, tuned: Iterable[tuple[CallShape, Any]], limit: int = 4
) -> list[tuple[float, Any]]:
    """The `limit` nearest of `tuned` (pairs of a call's shape and a value) in
    `shape`'s family, as (distance, value), nearest first (ties in the given order)."""
    found: list[tuple[float, int, Any]] = []
    for i, (other, value) in enumerate(tuned):
        if other.family != shape.family or len(other.sizes) != len(shape.sizes):
            continue
        found.append((distance(shape.sizes, other.sizes), i, value))
    found.sort(key=lambda t: (t[0], t[1]))
    return [(d, value) for d, _, value in found[:limit]]
