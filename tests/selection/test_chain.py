"""The selection chain: every tier, its events, and the rules that keep caches honest."""

import dataclasses
import logging
import threading

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune._src.caching.persistent import PersistentCache
from tests.helpers import CostKernel, RepCfg, RepeatKernel, cost_tuner, events_recorder, names, rand


def make(policy=None, persistent=None, **kw):
    kw.setdefault("tuner", cost_tuner(progress=False))  # winners independent of load
    events, on_event = events_recorder()
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), policy=policy, persistent=persistent, on_event=on_event, **kw
    )
    return kt.Executor(chain), chain, events


def key_of(ex, kernel, *args, **kwargs):
    inv = ex.invocation(kernel, *args, **kwargs)
    return (inv.device_fingerprint, inv.op_id_v, inv.call_key)


def test_override_is_used_and_written_nowhere(tmp_path):
    pc = PersistentCache(tmp_path)
    ex, chain, events = make(persistent=pc)
    x = rand((8, 8))
    out = ex(CostKernel(), x, cfg=RepCfg(reps=2))
    assert out.shape == (8, 8)
    assert names(events) == ["override"]
    assert events[0][1]["cfg"] == RepCfg(reps=2)
    assert len(chain.cache) == 0 and len(pc) == 0


def test_override_applies_even_under_heuristics_policy():
    ex, chain, events = make(policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"))
    assert ex.choose_config(CostKernel(), rand((4, 4)), cfg=RepCfg(reps=7)) == RepCfg(reps=7)


def test_autotune_picks_cheapest_of_several_fold_costs_and_caches_it(tmp_path):
    pc = PersistentCache(tmp_path)
    ex, chain, events = make(persistent=pc)
    x = rand((32, 32))
    cfg = ex.choose_config(CostKernel(), x)
    assert cfg == RepCfg(reps=1)
    assert names(events) == ["autotune_start", "autotune_finish"]
    finish = events[1][1]
    assert {"device", "op_id", "call_key", "cfg"} <= set(finish)
    assert finish["op_id"] == "cost@v0"
    assert len(finish["timings"]) == 3
    key = key_of(ex, CostKernel(), x)
    assert chain.cache.get(*key) == RepCfg(reps=1)
    assert pc.get(*key, cfg_type=RepCfg) == RepCfg(reps=1)
    # Second call: a memory hit.
    assert ex.choose_config(CostKernel(), x) == RepCfg(reps=1)
    assert events[-1][0] == "cache_hit" and events[-1][1]["level"] == "memory"


def test_persistent_hit_fills_memory_and_returns_the_kernel_type(tmp_path):
    pc = PersistentCache(tmp_path)
    x = rand((16, 16))
    ex1, _, _ = make(persistent=pc)
    ex1.choose_config(CostKernel(), x)
    ex2, chain2, events2 = make(persistent=PersistentCache(tmp_path))
    cfg = ex2.choose_config(CostKernel(), x)
    assert type(cfg) is RepCfg
    assert names(events2) == ["cache_hit"] and events2[0][1]["level"] == "persistent"
    assert len(chain2.cache) == 1


def test_a_kernel_without_heuristic_gets_its_candidates_type_back_from_disk(tmp_path):
    # No heuristic_cfg and no config_type: the config type is the candidates' type, so
    # a second process reads the tuned config as it was stored, not as a dict that
    # fails the kernel and is tuned again.
    class NoHeuristic(CostKernel):
        op_id = "cost_without_heuristic"
        heuristic_cfg = None

    x = rand((16, 16))
    ex1, _, _ = make(persistent=PersistentCache(tmp_path))
    assert ex1.choose_config(NoHeuristic(), x) == RepCfg(reps=1)
    ex2, _, events2 = make(persistent=PersistentCache(tmp_path))
    assert type(ex2.choose_config(NoHeuristic(), x)) is RepCfg
    assert names(events2) == ["cache_hit"] and events2[0][1]["level"] == "persistent"


def test_overlay_tier_wins_over_memory():
    ex, chain, events = make()
    x = rand((8, 8))
    key = key_of(ex, CostKernel(), x)
    chain.cache.put(*key, RepCfg(reps=4))
    with kt.overlay_cache({key: RepCfg(reps=16)}):
        assert ex.choose_config(CostKernel(), x) == RepCfg(reps=16)
        assert names(events)[-1] == "overlay_hit"
    assert ex.choose_config(CostKernel(), x) == RepCfg(reps=4)


def test_overlays_nest_innermost_wins():
    ex, chain, _ = make(policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"))
    x = rand((8, 8))
    key = key_of(ex, CostKernel(), x)
    with kt.overlay_cache({key: RepCfg(reps=2)}):
        with kt.overlay_cache({key: RepCfg(reps=3)}):
            assert ex.choose_config(CostKernel(), x) == RepCfg(reps=3)
        assert ex.choose_config(CostKernel(), x) == RepCfg(reps=2)
    assert ex.choose_config(CostKernel(), x) == RepCfg(reps=4)  # the heuristic


@pytest.mark.parametrize("mapping", [5, [1, 2], "cfgs"])
def test_an_overlay_that_is_no_mapping_is_a_type_error_naming_the_argument(mapping):
    # Before: dict()'s own message ("'int' object is not iterable"), which named
    # neither the argument nor what it takes.
    with pytest.raises(TypeError, match=r"overlay_cache\(mapping\) needs a mapping .* got"):
        with kt.overlay_cache(mapping):
            pass


def test_heuristics_tier_and_it_does_not_block_a_later_autotune(tmp_path):
    pc = PersistentCache(tmp_path)
    ex, chain, events = make(
        policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"), persistent=pc
    )
    x = rand((64, 64))
    assert ex.choose_config(CostKernel(), x) == RepCfg(reps=4)
    assert names(events) == ["heuristics"]
    assert len(chain.cache) == 0 and len(pc) == 0
    chain.policy = kt.AutotunePolicy()
    assert ex.choose_config(CostKernel(), x) in CostKernel().candidate_cfgs(None)
    assert "autotune_start" in names(events)


def test_eager_call_after_policy_change_tunes(tmp_path):
    ex, chain, events = make(policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"))
    x = rand((64, 64))
    ex(CostKernel(), x)
    ex(CostKernel(), x)
    chain.policy = kt.AutotunePolicy()
    ex(CostKernel(), x)
    assert names(events).count("autotune_start") == 1


def test_error_fallback_raises_naming_op_and_shapes():
    ex, _, events = make(policy=kt.AutotunePolicy(cache_miss_fallback="error"))
    with pytest.raises(kt.CacheMissError) as info:
        ex(CostKernel(), rand((12, 12)))
    message = str(info.value)
    assert "cost@v0" in message and "f32[12,12]" in message
    assert names(events) == ["error"]


def test_no_tier_left_raises_runtime_error_listing_what_was_tried():
    ex, _, _ = make(policy=kt.AutotunePolicy(allow_autotune=False, allow_heuristics=False))
    with pytest.raises(RuntimeError, match=r"cost@v0.*heuristics: not allowed"):
        ex(CostKernel(), rand((4, 4)))


def test_forbid_reautotune_reuses_after_clear_without_raising():
    ex, chain, events = make()
    x = rand((32, 32))
    first = ex.choose_config(CostKernel(), x)
    chain.cache.clear()
    second = ex.choose_config(CostKernel(), x)
    assert first == second
    assert names(events).count("autotune_start") == 1
    assert events[-1][1].get("reused") is True


def test_reautotune_allowed_tunes_again_after_clear():
    ex, chain, events = make(forbid_reautotune=False)
    x = rand((32, 32))
    ex.choose_config(CostKernel(), x)
    chain.cache.clear()
    ex.choose_config(CostKernel(), x)
    assert names(events).count("autotune_start") == 2


def test_six_threads_missing_one_key_tune_it_once():
    ex, chain, events = make()
    x = rand((48, 48))
    barrier = threading.Barrier(6)
    results = []

    def worker():
        barrier.wait()
        results.append(ex.choose_config(CostKernel(), x))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and len(set(results)) == 1  # every thread got the one result
    assert names(events).count("autotune_start") == 1


def test_listener_exception_is_logged_not_raised(caplog):
    def bad(event, **data):
        raise ValueError("listener broke")

    ex = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache(), on_event=bad))
    with caplog.at_level(logging.ERROR, logger="kerneltune"):
        out = ex(CostKernel(), rand((8, 8)), cfg=RepCfg(reps=1))
    assert out.shape == (8, 8)
    assert "listener" in caplog.text


def test_policy_override_is_context_local_and_does_not_leak_to_other_threads():
    ex, chain, _ = make()
    seen = {}
    inside = threading.Event()
    release = threading.Event()

    def other():
        inside.wait()
        seen["other"] = chain.effective_policy().allow_autotune
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with kt.policy_override(chain, autotune=False):
        seen["mine"] = chain.effective_policy().allow_autotune
        inside.set()
        release.wait()
    t.join()
    assert seen == {"mine": False, "other": True}
    assert chain.effective_policy().allow_autotune is True


def test_policy_override_without_selector_applies_to_every_selector():
    ex, chain, events = make()
    with kt.policy_override(cache_miss_fallback="heuristics"):
        assert ex.choose_config(CostKernel(), rand((8, 8))) == RepCfg(reps=4)
        assert kt.default_executor().chooser.effective_policy().cache_miss_fallback == "heuristics"
    assert names(events) == ["heuristics"]


def test_policy_override_rejects_unknown_fields_and_bad_values():
    with pytest.raises(TypeError, match="unknown policy field"):
        with kt.policy_override(allow_everything=True):
            pass
    with pytest.raises(ValueError, match="cache_miss_fallback"):
        with kt.policy_override(cache_miss_fallback="sometimes"):
            pass


def test_policy_override_retraces_a_function_jitted_outside():
    ex, chain, events = make(policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"))
    kernel = CostKernel()
    f = jax.jit(lambda x: ex(kernel, x))
    x = rand((8, 8))
    f(x)
    with kt.policy_override(chain, cache_miss_fallback="error"):
        with pytest.raises(kt.CacheMissError):
            f(x)
    f(x)  # back to the old trace: no error


def test_validate_backward_times_backward_and_forward_only_turns_it_off():
    seen = []

    class SpyTuner(kt.Tuner):
        def tune(self, make_fn, args, kwargs, candidates, **kw):
            seen.append(kw["backward"])
            return super().tune(make_fn, args, kwargs, candidates, **kw)

    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(validate_backward=True),
        tuner=SpyTuner(),
        forbid_reautotune=False,
    )
    ex = kt.Executor(chain)
    ex.choose_config(RepeatKernel(), rand((4,)))
    chain.cache.clear()
    with kt.forward_autotune_only():
        ex.choose_config(RepeatKernel(), rand((4,)))
    assert seen == [True, False]


def test_when_every_other_candidate_fails_the_heuristic_wins_the_tuning():
    class Broken(kt.Kernel):
        op_id = "broken"

        def run(self, x, *, cfg):
            if cfg.reps > 0:
                raise RuntimeError(f"no such block size {cfg.reps}")
            return x

        def heuristic_cfg(self, inv):
            return RepCfg(reps=0)

        def candidate_cfgs(self, inv):
            return [RepCfg(reps=1), RepCfg(reps=2)]

    ex, chain, events = make()
    cfg = ex.choose_config(Broken(), rand((4,)))
    # The heuristic is a contender: it ran, the others failed with their errors.
    assert cfg == RepCfg(reps=0)
    assert names(events)[-1] == "autotune_finish"
    finish = [d for e, d in events if e == "autotune_finish"][-1]
    assert finish["cfg"] == RepCfg(reps=0)


def test_autotune_under_jit_uses_tuning_inputs_never_tracers():
    seen = []

    class Spy(CostKernel):
        def tuning_inputs(self, inv):
            args, kwargs = super().tuning_inputs(inv)
            seen.append(args[0])
            return args, kwargs

    ex, chain, events = make()
    out = jax.jit(lambda x: ex(Spy(), x))(rand((16, 16)))
    assert out.shape == (16, 16)
    assert len(seen) == 1 and not isinstance(seen[0], jax.core.Tracer)
    assert float(jnp.abs(seen[0]).sum()) > 0  # random data, not zeros


def test_hand_built_invocation_uses_the_kernels_version_and_key_builder():
    class Versioned(CostKernel):
        version = "3"

        @staticmethod
        def key_builder(inv):
            return "rows=" + str(inv.args[0].shape[0])

    ex, chain, _ = make(policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"))
    x = rand((8, 8))
    key = (kt.device_fingerprint(), "cost@v3", "rows=8")
    chain.cache.put(*key, RepCfg(reps=2))
    by_hand = kt.Invocation(op_id="cost", args=(x,), kwargs={})
    assert chain.choose(by_hand, Versioned()) == RepCfg(reps=2)
    assert ex.choose_config(Versioned(), x) == RepCfg(reps=2)


def test_fwd_params_accept_positional_fields():
    assert kt.FwdParams(128, 64, 4, 2) == kt.FwdParams(
        q_blocksize=128, kv_blocksize=64, num_warps=4, num_stages=2
    )
    assert kt.BwdParams(64, 32).kv_blocksize == 32


class LastCandidateTuner:
    """A custom tuner with only the documented protocol: its own rule (the last
    candidate) must decide, not kerneltune's timing."""

    def __init__(self):
        self.calls = []

    def measure(self, fn, *args, **kwargs):
        return 1.0

    def autotune(self, make_fn, args, kwargs, candidates):
        self.calls.append(list(candidates))
        make_fn(candidates[-1])(*args, **kwargs)  # it may run what it picks
        return candidates[-1]


class FirstCandidateTuner(kt.Tuner):
    """A `Tuner` subclass that overrides only `autotune`."""

    def autotune(self, make_fn, args, kwargs, candidates):
        return next(iter(candidates))


def test_the_chain_calls_a_custom_tuners_autotune():
    # Issue 13.6: the chain called `tune`, bypassing a tuner that implements only the
    # documented protocol (and a subclass's own `autotune`).
    @dataclasses.dataclass(frozen=True)
    class C:
        n: int

    class K(kt.Kernel):
        op_id = "custom_tuner_protocol"

        def run(self, x, *, cfg):
            return x * cfg.n

        def heuristic_cfg(self, inv):
            return C(1)

        def candidate_cfgs(self, inv):
            return [C(1), C(2), C(3)]

    custom = LastCandidateTuner()
    chain = kt.ConfigSelectorChain(kt.ConfigCache(), tuner=custom)
    x = jnp.ones(4)
    assert float(kt.Executor(chain)(K(), x)[0]) == 3.0
    assert custom.calls == [[C(1), C(2), C(3)]]
    why = kt.explain(K(), x, executor=kt.Executor(chain))
    assert why.cfg == C(3) and why.report.strategy == "LastCandidateTuner.autotune"
    chain = kt.ConfigSelectorChain(kt.ConfigCache(), tuner=FirstCandidateTuner())
    assert kt.Executor(chain).choose_config(K(), x) == C(1)
    assert kt.autotune(K(), x, tuner=custom) == C(3)


def test_a_miss_asks_the_kernel_for_its_candidates_once():
    calls = []

    class Counted(CostKernel):
        op_id = "counted"

        def candidate_cfgs(self, inv):
            calls.append(inv.call_key)
            return super().candidate_cfgs(inv)

    ex, _, _ = make()
    assert ex.choose_config(Counted(), rand((8, 8))) == RepCfg(reps=1)
    assert len(calls) == 1  # a candidate hook may be costly (it may compile or probe)


class AllBroken(kt.Kernel):
    """Every config fails to trace, the heuristic's too (tuning cannot pick one)."""

    op_id = "all_broken"

    def run(self, x, *, cfg):
        raise RuntimeError(f"no such block size {cfg.reps}")

    def heuristic_cfg(self, inv):
        return RepCfg(reps=0)

    def candidate_cfgs(self, inv):
        return [RepCfg(reps=1), RepCfg(reps=2)]


def test_a_key_whose_every_candidate_failed_is_not_benchmarked_again():
    # Before: with forbid_reautotune, every later miss of such a key (a new trace, a
    # choose_config) compiled and ran every candidate again, and warned again.
    ex, chain, events = make()
    x = rand((8,))
    with pytest.warns(RuntimeWarning, match=r"failed for every one of 3 candidates.*size 2"):
        assert ex.choose_config(AllBroken(), x) == RepCfg(reps=0)
    assert names(events) == ["autotune_start", "autotune_finish", "heuristics"]
    assert ex.choose_config(AllBroken(), x) == RepCfg(reps=0)  # warnings are errors here
    assert names(events)[3:] == ["heuristics"]
    why = kt.explain(AllBroken(), x, executor=ex)
    assert why.tier == "heuristics"
    assert ("autotune", "every candidate failed when tuned earlier in this process") in why.misses
    # Allowed to tune again, it does.
    ex, chain, events = make(forbid_reautotune=False)
    for _ in range(2):
        with pytest.warns(RuntimeWarning, match="failed for every one"):
            ex.choose_config(AllBroken(), x)
    assert names(events).count("autotune_start") == 2


def test_the_warning_when_every_candidate_tried_failed_names_their_errors():
    # Before: it listed the first 8 candidates in order, those the search never tried
    # too ("RepCfg(reps=1): pruned: None"), and counted them as failed ("every one of
    # 40 candidates" where 6 were tried).
    class ManyBroken(AllBroken):
        op_id = "many_broken"

        def candidate_cfgs(self, inv):
            return [RepCfg(reps=r) for r in range(1, 41)]

    tuner = cost_tuner(progress=False, strategy="coordinate", max_evals=6)
    ex = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache(), tuner=tuner))
    with pytest.warns(RuntimeWarning, match="failed for every one of") as caught:
        assert ex.choose_config(ManyBroken(), rand((8,))) == RepCfg(reps=0)
    message = str(caught[0].message)
    assert "pruned" not in message and "None" not in message, message
    assert "every one of 6 candidates tried (35 others not tried)" in message, message
    assert message.count("no such block size") >= 6, message


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"autotune": "no"}, TypeError, r"autotune must be a bool or None, got 'no'"),
        ({"persist_autotune": "yes"}, TypeError, r"persist_autotune must be a bool, got 'yes'"),
        ({"forbid_reautotune": None}, TypeError, r"forbid_reautotune must be a bool, got None"),
        ({"on_event": 3}, TypeError, r"on_event must be callable .*, got 3"),
        ({"tuner": 3}, TypeError, r"tuner must be .*autotune.*, got int"),
        ({"persistent": "/tmp/cache"}, TypeError, r"persistent must be .*PersistentCache.*str"),
    ],
)
def test_chain_arguments_are_checked_when_it_is_made(kwargs, error, message):
    # Before: autotune="no" meant autotune=True (bool("no")); a path as `persistent`, a
    # tuner without the protocol or a non-callable on_event failed (or were only
    # logged) at the first call that used them.
    with pytest.raises(error, match=message):
        kt.ConfigSelectorChain(kt.ConfigCache(), **kwargs)


def test_an_overlay_config_of_another_type_is_a_type_error_naming_the_overlay():
    # Before: it reached the kernel, which failed inside its trace
    # (AttributeError: 'ScaleCfg' object has no attribute 'reps').
    @dataclasses.dataclass(frozen=True)
    class ScaleCfg:
        scale: float = 1.0

    ex, _, _ = make(policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"))
    x = rand((8, 8))
    key = key_of(ex, CostKernel(), x)
    with kt.overlay_cache({key: ScaleCfg(2.0)}):
        with pytest.raises(TypeError, match=r"overlay config for cost@v0 must be a RepCfg, got"):
            ex(CostKernel(), x)
    with kt.overlay_cache({key: {"reps": 2}}):  # plain fields still become the type
        assert ex.choose_config(CostKernel(), x) == RepCfg(reps=2)


def summary_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("tuned ")]


def test_one_summary_line_per_tuned_key_whatever_the_tuner(caplog, monkeypatch):
    # Before: a tuner with only the documented protocol logged none, and a training key
    # tuned in two stages (candidates sharing one backward timed forward only) logged
    # one line per stage, the first naming a forward-only winner.
    x = rand((16, 16))
    with caplog.at_level(logging.INFO, logger="kerneltune"):
        ex, _, _ = make(tuner=LastCandidateTuner())
        assert ex.choose_config(CostKernel(), x) == RepCfg(reps=1)
    (line,) = summary_lines(caplog)
    assert line.startswith("tuned cost@v0(f32[16,16]): RepCfg(reps=1)")
    assert "strategy=LastCandidateTuner.autotune" in line

    from kerneltune._src.kernel import hooks

    # reps=16 and reps=1 share one backward; the heuristic (reps=4) has its own.
    monkeypatch.setattr(hooks, "backward_tuned_apart", lambda kernel, cfg: cfg.reps != 4)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kerneltune"):
        ex, _, events = make(policy=kt.AutotunePolicy(validate_backward=True))
        assert ex.choose_config(CostKernel(), x) == RepCfg(reps=1)
    (line,) = summary_lines(caplog)
    assert line.startswith("tuned cost@v0(f32[16,16]): RepCfg(reps=1)")
    assert "over the heuristic" in line and "forward only for the 2 candidates" in line
