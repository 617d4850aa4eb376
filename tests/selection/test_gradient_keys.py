"""A call under a gradient, to a kernel whose config also picks its backward (it
`tunes_training_apart`), is a key of its own, tuned for forward + backward: the best
training step is not the best forward (issue 10: tokamax's attention forward beats
cuDNN's at some shapes while its backward loses at all of them)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune._src.core import tracing
from tests.helpers import cost_tuner, costed_sin, executor


@dataclasses.dataclass(frozen=True, kw_only=True)
class PassCosts:
    """What a config costs in the forward and in the backward (`ktcost_N` scopes)."""

    fwd: int
    bwd: int


class TwoPass(kt.Kernel):
    """`sin(x)` by "backends" that JAX differentiates, each with its own costs: one
    with the cheapest forward and a dear backward, one cheap in both together."""

    op_id = "two-pass"
    config_type = PassCosts
    tunes_training_apart = True

    def run(self, x, *, cfg):
        return costed_sin(cfg.fwd, cfg.bwd)(x)

    def heuristic_cfg(self, inv):
        return PassCosts(fwd=8, bwd=8)

    def candidate_cfgs(self, inv):
        return [PassCosts(fwd=1, bwd=16), PassCosts(fwd=4, bwd=4)]

    def differentiated_by_jax(self, cfg):
        return True


class ForwardOnlyKeys(TwoPass):
    """The same kernel, not tuned apart for training: its keys ignore gradients."""

    op_id = "two-pass-plain"
    tunes_training_apart = False


def _tuning(kernel, size):
    """A tuning executor (deterministic cost timer) with its event list, and an input."""
    events = []
    ex = executor(events=events, tuner=cost_tuner(iters=1))
    return events, ex, kernel, jnp.linspace(0.0, 1.0, size)


def _tuned(events):
    return [(d["call_key"], d["backward"]) for e, d in events if e == "autotune_start"]


def test_the_best_forward_and_the_best_training_step_are_chosen_apart():
    events, ex, kernel, x = _tuning(TwoPass(), 64)

    def loss(x):
        return ex(kernel, x).sum()

    assert ex.choose_config(kernel, x) == PassCosts(fwd=1, bwd=16)  # cheapest forward
    jax.jit(jax.grad(loss))(x)
    (fwd_key, fwd_backward), (grad_key, grad_backward) = _tuned(events)
    assert fwd_key != grad_key and (fwd_backward, grad_backward) == (False, True)
    winners = [d["cfg"] for e, d in events if e == "autotune_finish"]
    assert winners == [PassCosts(fwd=1, bwd=16), PassCosts(fwd=4, bwd=4)]
    # Values and gradients are the op's, whichever config runs.
    assert jnp.allclose(jax.grad(loss)(x), jnp.cos(x), atol=1e-6)


def test_an_eager_gradient_does_not_reuse_the_forward_program():
    # The eager fast path remembers the forward's program for these shapes; a call
    # under jax.grad must still be keyed (and tuned) as a training call.
    events, ex, kernel, x = _tuning(TwoPass(), 32)
    ex(kernel, x)
    ex(kernel, x)  # now on the fast path
    jax.grad(lambda x: ex(kernel, x).sum())(x)
    tuned = _tuned(events)
    assert [backward for _, backward in tuned] == [False, True]
    # Under vmap too: the same training key, now from the memory cache.
    del events[:]
    jax.vmap(jax.grad(lambda x: ex(kernel, x).sum()))(jnp.stack([x, x]))
    assert [(e, d["call_key"]) for e, d in events] == [("cache_hit", tuned[1][0])]


def test_kernels_whose_configs_do_not_pick_the_backward_keep_one_key():
    events, ex, kernel, x = _tuning(ForwardOnlyKeys(), 16)
    ex(kernel, x)
    jax.jit(jax.grad(lambda x: ex(kernel, x).sum()))(x)
    assert len(_tuned(events)) == 1


def test_differentiation_is_seen_through_vmap_and_not_through_a_nested_jit():
    seen = []

    def probe(x):
        seen.append(tracing.is_differentiated(x))
        return (x * 2.0).sum()

    x = jnp.ones(3)
    jax.grad(probe)(x)
    jax.jvp(probe, (x,), (x,))
    jax.grad(lambda x: jax.vmap(probe)(x).sum())(jnp.ones((2, 3)))
    jax.jit(probe)(x)
    jax.vmap(probe)(jnp.ones((2, 3)))
    jax.grad(jax.jit(lambda x: probe(x)))(x)  # traced before JAX differentiates it
    assert seen == [True, True, True, False, False, False]


def test_a_recorded_training_call_is_tuned_for_its_training_step(tmp_path):
    heuristics = executor(cache_miss_fallback="heuristics")
    kernel = TwoPass()
    x = jnp.linspace(0.0, 1.0, 16)
    kt.clear_invocations()
    with kt.record_calls():
        jax.jit(jax.grad(lambda x: heuristics(kernel, x).sum()))(x)
    path = tmp_path / "calls.json"
    assert kt.save_manifest(path) == 1
    kt.clear_invocations()
    (record,) = [r for calls in kt.load_manifest(path).values() for r in calls.values()]
    assert record.differentiated is True and record.signature.endswith("f32[16] (training)")
    chain = kt.ConfigSelectorChain(kt.ConfigCache(), tuner=cost_tuner(iters=1))
    result = kt.autotune_recorded(kt.load_manifest(path), selector=chain)
    assert [e.cfg for e in result] == [PassCosts(fwd=4, bwd=4)]


def test_a_manifest_with_a_bad_differentiated_field_is_refused(tmp_path):
    heuristics = executor(cache_miss_fallback="heuristics")
    kt.clear_invocations()
    with kt.record_calls():
        jax.grad(lambda x: heuristics(TwoPass(), x).sum())(jnp.ones(8))
    path = tmp_path / "calls.json"
    kt.save_manifest(path)
    kt.clear_invocations()
    doc = json.loads(path.read_text())
    text = json.dumps(doc)
    assert '"differentiated": true' in text
    path.write_text(text.replace('"differentiated": true', '"differentiated": "yes"'))
    with pytest.raises(Exception, match="differentiated"):
        records = kt.load_manifest(path)
        [r for calls in records.values() for r in calls.values()]
