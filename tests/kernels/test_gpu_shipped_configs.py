"""On a GPU: every norm and softmax config that this GPU model's shipped table chose
runs through the public op at its key's shape and matches the reference. A re-tuned
table (`tools.ship_tables`) brings configs no other test names (blocks and warp counts
of kerneltune's own Pallas kernels); this is where a wrong one would show. Skipped
without a GPU, and for a GPU model whose table holds no such key."""

import jax
import jax.numpy as jnp
import pytest

import kerneltune.kernels as ktk
from kerneltune._src.caching import storage
from kerneltune._src.caching.shipped import PACKAGE_TABLES, device_kind_of
from kerneltune._src.core import devices
from kerneltune.kernels.normalization.config import NormConfig
from kerneltune.kernels.normalization.reference import layer_norm_reference, rms_norm_reference
from kerneltune.kernels.softmax.config import SoftmaxConfig
from tests.helpers import close, rand

pytestmark = pytest.mark.gpu

OPS = ("layer_norm@v1", "rms_norm@v1", "softmax@v1")


def shipped_forward_keys():
    """(op, rows, width, config fields) of every forward norm and softmax key in the
    tables of this process's GPU model."""
    if jax.default_backend() != "gpu":
        return []
    kind = device_kind_of(devices.device_fingerprint())
    found = []
    for path in sorted(PACKAGE_TABLES.glob("*.json")):
        for e in storage.read_export_file(str(path)):
            if e["op_id"] not in OPS or device_kind_of(e["dev"]) != kind:
                continue
            if e["signature"].endswith("(training)"):
                continue
            rows, width = e["shape"]["sizes"][:2]
            found.append((e["op_id"].split("@")[0], rows, width, e["cfg"]))
    return found


def test_the_table_of_this_gpu_holds_norm_and_softmax_keys():
    if jax.default_backend() != "gpu":
        pytest.skip("needs a GPU")
    if not shipped_forward_keys():
        pytest.skip(f"no shipped norm or softmax key for {devices.device_fingerprint()}")
    assert {op for op, *_ in shipped_forward_keys()} == {"layer_norm", "rms_norm", "softmax"}


@pytest.mark.parametrize(
    ("op", "rows", "width", "fields"),
    shipped_forward_keys(),
    ids=lambda v: v if isinstance(v, str | int) else "-".join(f"{k}{x}" for k, x in v.items()),
)
def test_every_shipped_config_matches_the_reference(op, rows, width, fields):
    x = (rand((rows, width), seed=rows + width) * 2 + 0.5).astype(jnp.bfloat16)
    scale = (1 + 0.1 * rand((width,), seed=1)).astype(jnp.bfloat16)
    if op == "softmax":
        got = ktk.softmax(x, cfg=SoftmaxConfig(**fields))
        close(got.astype(jnp.float32), jax.nn.softmax(x.astype(jnp.float32)), tol=1e-2)
        return
    cfg = NormConfig(**fields)
    if op == "layer_norm":
        bias = (0.1 * rand((width,), seed=2)).astype(jnp.bfloat16)
        got = ktk.layer_norm(x, scale, bias, cfg=cfg)
        want = layer_norm_reference(x, scale, bias, eps=1e-6)
    else:
        got = ktk.rms_norm(x, scale, cfg=cfg)
        want = rms_norm_reference(x, scale, eps=1e-6)
    close(got.astype(jnp.float32), want, tol=2e-2)
