"""Validation never silently disappears (issue 12.5): with a kernel's reference
implementation every candidate — the heuristic config too — is checked against it; without
one, a failed heuristic is said out loud."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt


class Cost:
    """A deterministic timer: the largest `ktcost_N` in the program."""

    name = "cost"

    def sample(self, fn, arg_sets, calls, start):
        jax.block_until_ready(fn(*arg_sets[0]))
        return max(int(c) for c in re.findall(r"ktcost_(\d+)", fn.as_text())) * 1e-6


@dataclasses.dataclass(frozen=True)
class Cfg:
    cost: int
    wrong: bool = False
    broken: bool = False


class Doubler(kt.Kernel):
    """`2x`; a `wrong` config adds 1.0 to it, a `broken` one raises."""

    op_id = "validation_doubler"

    def __init__(self, heuristic, candidates):
        super().__init__()
        self._heuristic, self._candidates = heuristic, candidates

    def run(self, x, *, cfg):
        if cfg.broken:
            raise ValueError("this config cannot run")
        with jax.named_scope(f"ktcost_{cfg.cost}"):
            return x * 2.0 + (1.0 if cfg.wrong else 0.0)

    def heuristic_cfg(self, inv):
        return self._heuristic

    def candidate_cfgs(self, inv):
        return self._candidates


class DoublerWithReference(Doubler):
    op_id = "validation_doubler_ref"

    def reference(self, x):
        return x * 2.0


def tune(kernel):
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), tuner=kt.Tuner(timer=Cost(), progress=False, target_sample_s=5e-4)
    )
    why = kt.explain(kernel, jnp.ones((8, 8)), executor=kt.Executor(chain))
    return why.cfg, why.report


WRONG_AND_FAST, RIGHT = Cfg(10, wrong=True), Cfg(50)


def test_a_wrong_heuristic_cannot_invert_validation_when_the_kernel_has_a_reference():
    # Before: candidates were compared with the (wrong) heuristic's output, so the wrong
    # and fast config won and the right one was rejected, 3 runs of 3.
    kernel = DoublerWithReference(Cfg(30, wrong=True), [WRONG_AND_FAST, RIGHT])
    cfg, report = tune(kernel)
    assert cfg == RIGHT
    assert report.validated_by == "the reference implementation"
    status = {c.cfg: c.status for c in report.candidates}
    assert status[WRONG_AND_FAST] == "invalid" and status[Cfg(30, wrong=True)] == "invalid"
    assert "reference implementation" in str(kt.explain(kernel, jnp.ones((8, 8))))


def test_a_failing_heuristic_is_backed_by_the_reference_implementation():
    kernel = DoublerWithReference(Cfg(30, broken=True), [WRONG_AND_FAST, RIGHT])
    cfg, report = tune(kernel)
    assert cfg == RIGHT and report.validated_by == "the reference implementation"


def test_without_a_reference_a_failing_heuristic_is_a_warning_not_silence():
    kernel = Doubler(Cfg(30, broken=True), [WRONG_AND_FAST, RIGHT])
    with pytest.warns(RuntimeWarning, match=r"not validated: the heuristic config failed .*"
                      r"declares no reference implementation"):  # fmt: skip
        cfg, report = tune(kernel)
    assert cfg == WRONG_AND_FAST and not report.validated and report.validated_by == ""


def test_a_working_heuristic_still_validates_kernels_without_a_reference():
    kernel = Doubler(Cfg(30), [WRONG_AND_FAST, RIGHT])
    cfg, report = tune(kernel)
    assert cfg == Cfg(30) and report.validated_by == "the heuristic config"
    assert {c.cfg: c.status for c in report.candidates}[WRONG_AND_FAST] == "invalid"


def test_without_a_reference_or_heuristic_output_the_majority_of_candidates_decides():
    # Before: no bar at all, so the wrong and fast config won on time alone.
    slower_right = Cfg(60)
    kernel = Doubler(Cfg(30, broken=True), [WRONG_AND_FAST, RIGHT, slower_right])
    cfg, report = tune(kernel)
    assert cfg == RIGHT
    assert report.validated and report.validated_by == "the majority of candidates (2 of 3 agree)"
    wrong = {c.cfg: c for c in report.candidates}[WRONG_AND_FAST]
    assert wrong.status == "invalid" and "majority" in wrong.error


def test_candidates_that_do_not_agree_on_a_majority_are_not_called_validated():
    kernel = Doubler(Cfg(30, broken=True), [WRONG_AND_FAST, RIGHT])
    with pytest.warns(RuntimeWarning, match=r"groups of \[1, 1\]"):
        _, report = tune(kernel)
    status = {c.cfg: c.status for c in report.candidates}
    assert report.validated_by == "" and status[WRONG_AND_FAST] == status[RIGHT] == "ok"


def test_a_reference_that_would_not_fit_in_memory_leaves_the_heuristic_as_the_bar(monkeypatch):
    # At long sequences attention's float32 reference needs far more memory than the
    # call: it is refused before it runs, and the heuristic config's output is the bar.
    from kerneltune._src.tuning import memory

    monkeypatch.setattr(memory, "free_bytes", lambda device=None: 1)
    monkeypatch.setattr(memory, "program_bytes", lambda compiled: 2**30)
    kernel = DoublerWithReference(Cfg(30), [WRONG_AND_FAST, RIGHT])
    # Every candidate is refused too (each "needs" 1 GiB of 1 byte free): the heuristic
    # runs, with one warning that counts every candidate timed (the heuristic too).
    with pytest.warns(RuntimeWarning, match=r"failed for every one of 3 candidates") as caught:
        cfg, _ = tune(kernel)
    assert cfg == Cfg(30)
    message = str(caught[0].message)
    assert (
        f"{RIGHT}: oom: DoesNotFit: this candidate would run out of memory: it needs 1.00 GiB"
        in message
    )


def test_the_reference_is_skipped_alone_when_only_it_would_not_fit(monkeypatch):
    from kerneltune._src.tuning import memory

    real_check = memory.check_fits

    def check(compiled, what, *, free=None):
        if what == "the reference implementation":
            raise memory.DoesNotFit(f"{what} would run out of memory: it needs 64.00 GiB")
        real_check(compiled, what, free=free)

    monkeypatch.setattr(memory, "check_fits", check)
    kernel = DoublerWithReference(Cfg(30), [WRONG_AND_FAST, RIGHT])
    cfg, report = tune(kernel)
    assert cfg == Cfg(30) or cfg == RIGHT
    assert report.validated_by.startswith(
        "the heuristic config (the reference implementation failed"
    )
    assert "64.00 GiB" in report.validated_by
    assert {c.cfg: c.status for c in report.candidates}[WRONG_AND_FAST] == "invalid"
