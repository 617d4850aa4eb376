"""What device we run on: its kind, the backend used for dispatch, its fingerprint."""

from __future__ import annotations

import functools
from typing import Literal

import jax

from kerneltune._src.core import options

DeviceKind = Literal["gpu", "tpu", "cpu"]
Backend = Literal["triton", "pallas", "xla"]

_BACKEND_OF_KIND: dict[str, Backend] = {"gpu": "triton", "tpu": "pallas", "cpu": "xla"}


@functools.cache
def _default_device_kind() -> DeviceKind:
    platform = jax.devices()[0].platform.lower()
    if platform in ("gpu", "cuda", "rocm"):
        return "gpu"
    if platform == "tpu":
        return "tpu"
    return "cpu"


def device_kind() -> DeviceKind:
    """The kind of JAX's default device: "gpu", "tpu" or "cpu".

    Example:
      >>> import kerneltune
      >>> kerneltune.device_kind() in ("gpu", "tpu", "cpu")
      True
    """
    return _default_device_kind()


def get_device_platform() -> Backend:
    """The backend used for platform dispatch: GPU → "triton", TPU → "pallas",
    CPU → "xla"; `KERNELTUNE_PLATFORM` overrides it (e.g. "xla" on a GPU)."""
    forced = options.PLATFORM.value
    if forced is not None:
        return forced
    return _BACKEND_OF_KIND[device_kind()]


@functools.cache
def device_fingerprint() -> str:
    """`"<device_kind>|<platform_version>"` of the default device, e.g.
    `"NVIDIA H200|cuda 13000"` or `"cpu|cpu"`: configs tuned on one device are only
    reused on a device with the same fingerprint."""
    device = jax.devices()[0]
    kind = str(getattr(device, "device_kind", device.platform)).strip()
    try:
        version = str(device.client.platform_version).strip()
    except Exception:
        version = device.platform
    version = _short_platform_version(device.platform, version)
    return f"{kind}|{version}"


def _short_platform_version(platform: str, version: str) -> str:
    # GPU clients report e.g. "cuda 13000" but some add build details after it;
    # the CPU client reports "<unknown>" or a long string: keep it stable and short.
    if platform == "cpu":
        return "cpu"
    return " ".join(version.split()[:2]) or platform
