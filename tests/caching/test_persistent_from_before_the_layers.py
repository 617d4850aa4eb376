"""Caches and tables written before `_src/` was split into one package per layer still
hit: the keys, the entry format and the configs' stored type names did not move.

`tests/data/cache_before_layers/` is a persistent cache written by commit 74d4119 (the
last one with the flat `_src/`), with this file run as a script:

    PYTHONPATH=<checkout of 74d4119> python tests/caching/test_persistent_from_before_the_layers.py DIR

It uses only the public API, so it runs on either layout.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp

import kerneltune as kt
import kerneltune.kernels as ops

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "cache_before_layers"


def calls(executor):
    """The calls whose configs the fixture holds: a user's kernel, tuned, and bundled
    ops (their heuristic configs stored as if tuned), static arguments included."""
    from tests.helpers import CostKernel

    x = jax.random.normal(jax.random.PRNGKey(0), (16, 16), jnp.float32)
    q = jax.random.normal(jax.random.PRNGKey(1), (1, 16, 2, 8), jnp.float32)
    rows = jax.random.normal(jax.random.PRNGKey(2), (8, 128), jnp.float32)
    scale, offset = jnp.ones((128,)), jnp.zeros((128,))
    return [
        lambda: executor(CostKernel(), x),
        lambda: ops.softmax(rows, executor=executor),
        lambda: ops.layer_norm(rows, scale, offset, executor=executor),
        lambda: ops.matmul(rows, rows.T, executor=executor),
        lambda: _where_the_flash_kernel_runs(
            lambda: ops.attention(q, q, q, is_causal=True, executor=executor)
        ),
    ]


def _where_the_flash_kernel_runs(call):
    # Plain attention's entry is the flash kernel's (attention@v1), which a CPU now runs
    # only when asked for (the Pallas interpreter); elsewhere plain calls on a CPU take
    # the variants' XLA code. The fixture's writer (74d4119) ran it on every CPU call.
    try:
        from kerneltune._src.core import options
    except ImportError:  # the flat `_src/` of 74d4119, which runs it anyway
        return call()
    with options.scoped(platform="triton"):
        return call()


class Recorder:
    """A chooser that asks `chain` and remembers each (invocation, config)."""

    def __init__(self, chain):
        self.chain = chain
        self.chosen = []

    def choose(self, inv, kernel):
        cfg = self.chain.choose(inv, kernel)
        self.chosen.append((inv, cfg))
        return cfg


def write_fixture(where: pathlib.Path) -> None:
    from tests.helpers import cost_tuner

    persistent = kt.PersistentCache(where)
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), tuner=cost_tuner(progress=False), persistent=persistent
    )
    recorder = Recorder(chain)
    for call in calls(kt.Executor(recorder)):
        call()
    for inv, cfg in recorder.chosen:
        key = (inv.device_fingerprint, inv.op_id_v, inv.call_key)
        if key not in persistent:  # an untunable call ran on its heuristic
            persistent.put(*key, cfg, signature=inv.signature, shape=inv.shape)


def test_a_cache_written_before_the_layers_hits_every_call(tmp_path):
    where = tmp_path / "cache"
    shutil.copytree(DATA, where)
    events = []
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(cache_miss_fallback="error"),
        persistent=kt.PersistentCache(where),
        on_event=lambda event, **data: events.append((event, data)),
    )
    for call in calls(kt.Executor(chain)):
        call()
    assert len(events) == 5
    assert {(e, d.get("level")) for e, d in events} == {("cache_hit", "persistent")}, events
    stored = [d["cfg"] for _, d in events if d["op_id"].startswith("attention@")]
    assert type(stored[0]) is kt.kernels.FwdParams


def test_the_shipped_tables_name_the_attention_configs_where_they_still_are():
    # Entries store their config's qualified name; tables written before the layers name
    # `kerneltune._src.params`, where `FwdParams` still lives.
    from kerneltune._src.caching import shipped

    names = {e.cfg_type for e in shipped.package_tables()._index().values()}
    assert "kerneltune._src.params.FwdParams" in names
    assert all(n.startswith(("kerneltune._src.params.", "kerneltune.kernels.")) for n in names)
    fwd = kt.kernels.FwdParams
    assert f"{fwd.__module__}.{fwd.__qualname__}" == "kerneltune._src.params.FwdParams"


if __name__ == "__main__":
    write_fixture(pathlib.Path(sys.argv[1]))
