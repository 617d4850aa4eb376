"""A stored config that the kernel cannot trace is a miss with one warning, never a
crash on every call (issue 27): a block of -1 written by hand or by a bug, or a config of
a kernel whose code changed without a version bump."""

from __future__ import annotations

import dataclasses
import warnings

import jax.numpy as jnp
import pytest

import kerneltune as kt


@dataclasses.dataclass(frozen=True)
class Blocks:
    block: int = 4


class Blocked(kt.Kernel):
    op_id = "stored_failures_blocked"

    def run(self, x, *, cfg):
        if cfg.block <= 0:
            raise ValueError(f"block must be positive, got {cfg.block}")
        return x.reshape(-1, cfg.block).sum(1).sum()  # the same for every valid block

    def heuristic_cfg(self, inv):
        return Blocks(4)

    def candidate_cfgs(self, inv):
        return [Blocks(2), Blocks(4)]


BAD = Blocks(-1)
X = jnp.arange(16.0)


class FixedTable:
    """A shipped table (duck-typed) that holds one config for every key."""

    def __init__(self, cfg):
        self.cfg = cfg

    def get(self, dev, op_id_v, call_key, cfg_type=None):
        return self.cfg

    def get_entry(self, dev, op_id_v, call_key):
        return None


def calls(ex, n=2):
    """Calls the kernel `n` times, checks every result, and returns the warnings about
    stored configs that fail to trace."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [ex(Blocked(), X) for _ in range(n)]
    assert [float(out) for out in outs] == [120.0] * n
    return [str(w.message) for w in caught if "fails to trace" in str(w.message)]


def test_a_stored_config_that_fails_to_trace_is_tuned_again_and_replaced(tmp_path):
    first = kt.ConfigSelectorChain(
        kt.ConfigCache(), persistent=kt.PersistentCache(tmp_path), tuner=kt.Tuner(progress=False)
    )
    kt.Executor(first)(Blocked(), X)
    ((key, _),) = first.cache.items()
    kt.PersistentCache(tmp_path).put(*key, BAD)  # as a bug or a hand edit would leave it

    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), persistent=kt.PersistentCache(tmp_path), tuner=kt.Tuner(progress=False)
    )
    found = calls(kt.Executor(chain))
    assert len(found) == 1 and "Blocks(block=-1)" in found[0] and "persistent" in found[0]
    assert "block must be positive" in found[0]
    # Tuned again, and the bad entry replaced: a new process hits the tuned config.
    stored = kt.PersistentCache(tmp_path).get(*key, cfg_type=Blocks)
    assert stored in (Blocks(2), Blocks(4))
    again = kt.ConfigSelectorChain(kt.ConfigCache(), persistent=kt.PersistentCache(tmp_path))
    assert calls(kt.Executor(again)) == []


def test_a_shipped_config_that_fails_to_trace_is_a_miss():
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), shipped=FixedTable(BAD), tuner=kt.Tuner(progress=False)
    )
    found = calls(kt.Executor(chain))
    assert len(found) == 1 and "shipped" in found[0]
    ((_, cfg),) = chain.cache.items()
    assert cfg in (Blocks(2), Blocks(4))


def test_without_tuning_the_heuristic_serves_and_the_warning_is_given_once():
    policy = kt.AutotunePolicy(cache_miss_fallback="heuristics")
    chain = kt.ConfigSelectorChain(kt.ConfigCache(), policy=policy, shipped=FixedTable(BAD))
    found = calls(kt.Executor(chain), n=3)
    assert len(found) == 1


def test_a_good_stored_config_is_still_a_hit():
    chain = kt.ConfigSelectorChain(kt.ConfigCache(), shipped=FixedTable(Blocks(2)))
    assert calls(kt.Executor(chain)) == []
    ((_, cfg),) = chain.cache.items()
    assert cfg == Blocks(2)


@pytest.fixture(autouse=True)
def _registry(empty_registry):
    return empty_registry
