"""The first call of a key under a `FirstCallBudget`: what it times, and what it uses
when it times nothing.

A key no cache holds is predicted (`prediction.py`) from the tuned calls near it. Where
timings of those calls inform the prediction, the first call uses the predicted config
untimed (`trust_prediction`). Otherwise it times the heuristic and the `candidates`
configs predicted fastest, within `key_s` seconds, while the selector chain has spent
less than `process_s` seconds that way (`Ledger`); after that, the prediction untimed.
Processes of one job settle the plan together (`agreed`): each must time the same
candidates, or none, and use the same config, although their caches and their time
spent may differ.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from kerneltune._src.caching import tuned_neighbours
from kerneltune._src.caching.cache import CacheKey
from kerneltune._src.kernel import hooks
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import Invocation, Kernel
from kerneltune._src.selection import prediction
from kerneltune._src.selection.policy import FirstCallBudget
from kerneltune._src.tuning import distributed
from kerneltune._src.tuning.report import format_seconds
from kerneltune._src.tuning.tuner import Tuner


@dataclasses.dataclass(frozen=True)
class Grant:
    """The seconds one key's first call may take: `limit` (the tuner's time budget) and
    `grace` (how much longer its first choice is waited for), and `committed_s`, the
    seconds of the process's budget spent or granted to other keys before it."""

    limit: float
    grace: float
    committed_s: float

    @property
    def total(self) -> float:
        return self.limit + self.grace


class Ledger:
    """The seconds a selector chain has spent tuning first calls under a budget, and
    those granted to first calls under way."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent = 0.0
        self._granted = 0.0

    @property
    def spent_s(self) -> float:
        return self._spent

    def grant(self, budget: FirstCallBudget) -> Grant:
        """What the next key may take: `key_s`, and as long again for its first
        choice, as far as the process's seconds left allow. What is granted counts as
        spent until `settle`: a key started when 1 s was left once took its whole
        `key_s` (and more), and threads missing other keys at once each took theirs."""
        with self._lock:
            committed = self._spent + self._granted
            left = budget.process_s - committed
            limit = max(0.0, min(budget.key_s, left))
            grace = max(0.0, min(limit, left - limit))
            self._granted += limit + grace
            return Grant(limit, grace, committed)

    def settle(self, grant: Grant, seconds: float) -> None:
        """The key's first call is over: it took `seconds` of what it was granted."""
        with self._lock:
            self._granted -= grant.total
            self._spent += max(0.0, seconds)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the first call of a key does.

    Attributes:
      prediction: the call's candidates, predicted fastest first.
      space: the configs a full search would time (the heuristic first).
      shortlist: the configs to time, the first choice first (`Prediction.shortlist`);
        empty: none.
      untimed: the configs to use untimed, in order (the first that traces is used).
      why_untimed: why nothing is timed ("" when the shortlist is).
    """

    prediction: prediction.Prediction
    space: tuple[Any, ...]
    shortlist: tuple[Any, ...]
    untimed: tuple[Any, ...]
    why_untimed: str = ""

    @property
    def partial(self) -> bool:
        """The shortlist leaves some of the space untimed."""
        return len(self.shortlist) < len(self.space)


def space_of(candidates: Sequence[Any], heuristic: Any) -> tuple[Any, ...]:
    """The configs a search of the call times: the heuristic, then the other candidates."""
    if heuristic is None:
        return tuple(candidates)
    return (heuristic, *(c for c in candidates if c != heuristic))


def predict_call(
    inv: Invocation[Any, Any],
    kernel: Kernel[Any, Any],
    key: CacheKey,
    candidates: Sequence[Any],
    *,
    local: tuned_neighbours.LocalIndex | None,
    persistent: Any,
    shipped: Any,
) -> prediction.Prediction:
    """The prediction for a call, from the tuned calls of its family known here."""
    shape = inv.shape
    calls = tuned_neighbours.timed_calls(
        shape,
        key[0],
        key[1],
        hooks.config_type_of(kernel, inv),
        local=local,
        persistent=persistent,
        shipped=shipped,
    )
    return prediction.predict(
        None if shape is None else shape.sizes,
        candidates,
        hooks.find_heuristic(kernel, inv),
        calls,
        **size_models(kernel),
    )


def size_models(kernel: Kernel[Any, Any]) -> dict[str, Any]:
    """What `prediction.predict` carries a kernel's tuned timings across sizes with: a
    bundled kernel's `padded_work` and `config_across_sizes`; none for other kernels."""
    if not isinstance(kernel, BackendKernel):
        return {}
    return {"padded_work": kernel.padded_work, "across_sizes": kernel.config_across_sizes}


def plan(
    predicted: prediction.Prediction,
    candidates: Sequence[Any],
    budget: FirstCallBudget,
    spent_s: float,
) -> Plan:
    """This process's plan for a key: time the shortlist, unless the budget allows no
    timing (no candidates, or the process's seconds are spent)."""
    space = space_of(candidates, predicted.heuristic)
    untimed = tuple(predicted.usable())
    if budget.candidates == 0:
        why = "the first-call budget times no candidate (KERNELTUNE_FIRST_CALL_CANDIDATES=0)"
        return Plan(predicted, space, (), untimed, why)
    if budget.trust_prediction and predicted.informed:
        why = (
            "the prediction rests on timings of tuned calls nearby "
            "(KERNELTUNE_FIRST_CALL_TRUST_PREDICTION=1)"
        )
        return Plan(predicted, space, (), untimed, why)
    if spent_s >= budget.process_s:
        why = (
            f"this process has spent its first-call tuning budget ({spent_s:.1f} s of "
            f"{budget.process_s:g} s spent or under way, KERNELTUNE_FIRST_CALL_PROCESS_S)"
        )
        return Plan(predicted, space, (), untimed, why)
    return Plan(predicted, space, tuple(predicted.shortlist(budget.candidates)), untimed)


def agreed(key: CacheKey, mine: Plan, *, what: str) -> Plan:
    """The plan every process of the job follows: process 0's shortlist and untimed
    order (their caches, which the prediction reads, may differ), timed only when no
    process is out of budget. With one process, `mine`."""
    index = {prediction.config_id(c): i for i, c in enumerate(mine.space)}
    value = {
        "space": distributed.candidates_digest(list(mine.space)),
        "shortlist": [index[prediction.config_id(c)] for c in mine.shortlist],
        "untimed": [index[prediction.config_id(c)] for c in mine.untimed],
        "why_untimed": mine.why_untimed,
    }
    plans = distributed.share(key, "first_call", value, what=what)
    if len(plans) == 1:
        return mine
    spaces = {p["space"] for p in plans.values()}
    if len(spaces) > 1:
        raise distributed.AgreementError(
            f"the processes have different candidate lists for {what}, so they cannot "
            "agree on one config. Candidate lists must not depend on the process."
        )
    first = plans[min(plans)]
    why = next((p["why_untimed"] for _, p in sorted(plans.items()) if p["why_untimed"]), "")
    shortlist = () if why else tuple(mine.space[i] for i in first["shortlist"])
    untimed = tuple(mine.space[i] for i in first["untimed"]) or mine.untimed
    return dataclasses.replace(mine, shortlist=shortlist, untimed=untimed, why_untimed=why)


def first_choice_untimed(plan_: Plan, report: Any) -> bool:
    """True when the budget cut the shortlist's first config (the heuristic, or the
    prediction's best) before it was timed, while another was timed: a winner then
    only shows which configs build fastest."""
    first = plan_.shortlist[0]
    for result in report.candidates:
        if result.cfg == first:
            return result.status == "pruned" and report.best != first
    return False


def budget_tuner(tuner: Any, grant: Grant) -> Any:
    """The chain's tuner, bounded to the seconds granted to one key (`Ledger.grant`):
    the shortlist is searched whole, and what has not run when the time is up is
    abandoned (the first in line, `grant.grace` later). A tuner of another kind times
    the shortlist its own way."""
    if not isinstance(tuner, Tuner):
        return tuner
    limit = grant.limit if tuner.time_budget_s is None else min(grant.limit, tuner.time_budget_s)
    run_limit = (
        grant.limit if tuner.run_timeout_s is None else min(grant.limit, tuner.run_timeout_s)
    )
    return dataclasses.replace(
        tuner,
        strategy="exhaustive",
        time_budget_s=limit,
        run_timeout_s=run_limit,
        abandon_late=True,
        first_grace_s=min(limit, grant.grace),
    )


def tuned_note(plan_: Plan, limit_s: float, cut: int) -> str:
    """What `explain` says of a key tuned under the budget, within `limit_s`."""
    heuristic, shortlist = plan_.prediction.heuristic, plan_.shortlist
    timed = f"the heuristic and the {len(shortlist) - 1} other candidate(s) predicted fastest"
    if heuristic is None:
        timed = f"the {len(shortlist)} candidate(s) predicted fastest"
    elif shortlist[0] != heuristic:
        timed = (
            f"the config predicted fastest, the heuristic and {len(shortlist) - 2} other "
            "candidate(s) predicted fastest, in that order"
        )
    late = f"; {cut} not run within {format_seconds(limit_s)}" if cut else ""
    return (
        f"tuned under the first-call budget: timed {timed} of {len(plan_.space)}{late} "
        f"({plan_.prediction.describe()}); a full tuning (kt.autotune, autotune_lowered, "
        "kerneltune tune) completes it"
    )


def predicted_note(plan_: Plan) -> str:
    """What `explain` says of a key whose predicted config is used untimed."""
    return (
        f"not timed: {plan_.why_untimed}; {plan_.prediction.describe()}. A full tuning "
        "(kt.autotune, autotune_lowered, kerneltune tune) times it"
    )
