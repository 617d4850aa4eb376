"""Whether a compiled program fits in the device memory the process has left.

Tuning compiles programs the size of the user's call (candidates, the reference
implementation, forward + backward): a program that would not fit beside what the
process already holds is refused before it runs, with the bytes it needs in the
reason, instead of failing on the device or evicting the user's own buffers.
"""

from __future__ import annotations

from typing import Any

import jax

#: The share of the free device memory a program may plan to use: XLA's estimate
#: leaves out fragmentation and the allocator's own rounding.
USABLE_SHARE = 0.9


class DoesNotFit(MemoryError):
    """A compiled program needs more device memory than the process has left. Its
    message says "out of memory", so a candidate refused this way is recorded as
    "oom" like one that ran out on the device."""


def free_bytes(device: Any = None) -> int | None:
    """Bytes the allocator of `device` (default: the first local device) can still
    hand out, or None where the platform does not report it (CPU)."""
    device = jax.local_devices()[0] if device is None else device
    try:
        stats = device.memory_stats()
    except Exception:  # some platforms raise rather than return None
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def program_bytes(compiled: Any) -> int | None:
    """Device memory a compiled program allocates when it runs (its outputs and
    temporaries; its arguments exist already), or None when XLA does not say."""
    try:
        m = compiled.memory_analysis()
    except Exception:
        return None
    if m is None:
        return None
    alias = getattr(m, "alias_size_in_bytes", 0) or 0
    return int(m.output_size_in_bytes) + int(m.temp_size_in_bytes) - int(alias)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(compiled: Any, what: str, *, free: int | None = None) -> None:
    """Raises `DoesNotFit` when `compiled` needs more than `USABLE_SHARE` of the free
    device memory (`free`: measured now when not given)."""
    need = program_bytes(compiled)
    if need is None:
        return
    free = free_bytes() if free is None else free
    if free is None or need <= USABLE_SHARE * free:
        return
    raise DoesNotFit(
        f"{what} would run out of memory: it needs {gib(need)} of device memory and "
        f"{gib(free)} are free"
    )
