"""Static kernel arguments that are functions or types (issue 27): jitted functions,
deep copies of them, and Python's scalar types are keyed by name and survive manifests."""

from __future__ import annotations

import copy
import dataclasses

import jax
import jax.numpy as jnp

import kerneltune as kt
from kerneltune._src.core import keys
from kerneltune._src.kernel import recording


@dataclasses.dataclass(frozen=True)
class Cfg:
    reps: int = 1


class Activated(kt.Kernel):
    op_id = "static_arguments_activated"

    def run(self, x, *, cfg, act=jax.nn.silu, acc_type=float):
        return act(x.astype(jnp.float32)) * cfg.reps

    def heuristic_cfg(self, inv):
        return Cfg(1)


def key(**kwargs):
    return keys.stable_json(kwargs)


def test_jitted_functions_are_keyed_by_the_name_of_the_function_inside():
    # `copy.deepcopy(jax.nn.silu)` (as flax and equinox do when they copy a module) kept
    # no name: keying it raised "stable_json cannot encode a value of type PjitFunction".
    silu = key(act=jax.nn.silu)
    assert key(act=copy.deepcopy(jax.nn.silu)) == silu
    assert key(act=jax.jit(jax.nn.silu)) == silu
    assert key(act=copy.deepcopy(jax.jit(jax.nn.gelu))) == key(act=jax.nn.gelu) != silu
    assert key(acc_type=float) != key(acc_type=int)


def test_a_manifest_with_a_type_and_a_copied_jitted_function_round_trips(tmp_path):
    recording.clear_invocations()
    heuristics = kt.Executor(
        kt.ConfigSelectorChain(
            kt.ConfigCache(), policy=kt.AutotunePolicy(cache_miss_fallback="heuristics")
        )
    )
    with recording.record_calls():
        out = heuristics(Activated(), jnp.ones(8), act=copy.deepcopy(jax.nn.silu), acc_type=float)
    assert float(out[0]) == float(jax.nn.silu(1.0))
    assert kt.save_manifest(tmp_path / "calls.json") == 1
    recording.clear_invocations()
    (records,) = kt.load_manifest(tmp_path / "calls.json").values()
    (record,) = records.values()
    assert record.kwargs["acc_type"] is float
    assert record.kwargs["act"] is jax.nn.silu  # found again by name
    # The record's key is the one the call had.
    inv = heuristics.invocation(Activated(), jnp.ones(8), act=jax.nn.silu, acc_type=float)
    assert record.call_key == inv.call_key
