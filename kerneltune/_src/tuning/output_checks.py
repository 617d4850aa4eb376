"""What a candidate's first output is compared with, and whether it passed.

The bar, best first: the op's reference implementation (when the kernel declares
one: every candidate, the heuristic config too, must match it); else the heuristic
config's output; else the candidates vote: outputs that agree form a group (one
representative output kept per group) and, once every candidate ran, those outside a
strict majority are invalid. NaN never passes. Without any bar, the report says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kerneltune._src.tuning import validate
from kerneltune._src.tuning.candidate import Candidate, describe


class OutputChecks:
    """The validation of one tuning's outputs.

    Args:
      expected_fn: computes the reference implementation's output from the argument
        sets (None when the kernel declares none).
      enabled: validate at all (`Tuner(validate=...)`).
      rtol: the tolerance, as `validate.compare` takes it.
    """

    def __init__(
        self,
        expected_fn: Callable[[list[list[Any]]], Any] | None,
        *,
        enabled: bool,
        rtol: Any,
    ) -> None:
        self._expected_fn = expected_fn
        self._enabled = enabled
        self._rtol = rtol
        self._expected: Any = None
        self._expected_error: str | None = None
        self._groups: list[tuple[Any, list[Candidate]]] = []
        self._majority: tuple[int, int] | None = None  # (agreeing, voting) once settled
        self._no_majority = ""

    def expected(self, arg_sets: list[list[Any]]) -> Any:
        """The reference implementation's output on the first argument set (computed
        once), or None without one or when it failed."""
        if self._expected is None and self._expected_fn is not None and self._enabled:
            try:
                self._expected = self._expected_fn(arg_sets)
            except Exception as e:  # then the reference config's output is the bar
                self._expected_error = describe(e)
            self._expected_fn = None
        return self._expected

    def check(
        self, c: Candidate, out: Any, ref: Candidate | None, arg_sets: list[list[Any]]
    ) -> None:
        """Checks `c`'s first output `out` (`ref`: the heuristic config's candidate);
        a failed check ends `c` as "invalid"."""
        if not self._enabled:
            return
        expected = self.expected(arg_sets)
        if expected is not None:
            verdict = validate.compare(out, expected, self._rtol)
            c.rel_error = verdict.rel_error
            if not verdict.ok:
                c.fail(
                    "invalid",
                    f"output differs from the reference implementation's: {verdict.reason}",
                )
        elif ref is not None and ref.ok and ref.output is not None and c is not ref:
            verdict = validate.compare(out, ref.output, self._rtol)
            c.rel_error = verdict.rel_error
            if not verdict.ok:
                c.fail("invalid", f"output differs from the reference config's: {verdict.reason}")
        elif validate.has_nan(out):
            c.fail("invalid", "output contains NaN")
        elif c is not ref:
            self._join_group(c, out)

    def _join_group(self, c: Candidate, out: Any) -> None:
        for representative, members in self._groups:
            if validate.compare(out, representative, self._rtol).ok:
                members.append(c)
                return
        self._groups.append((out, [c]))

    def settle_by_majority(self) -> None:
        """When outputs had no bar (no reference implementation, and no working
        heuristic config), the candidates that disagree with a strict majority of those
        that ran are invalid. Without a majority, nothing is decided (and said so)."""
        groups = [[m for m in members if m.ok] for _, members in self._groups]
        self._groups = []  # the representative outputs are no longer needed
        voting = sum(len(g) for g in groups)
        if voting == 0:
            return
        largest = max(groups, key=len)
        if voting >= 2 and 2 * len(largest) > voting:
            self._majority = (len(largest), voting)
            for group in groups:
                if group is not largest:
                    for c in group:
                        c.fail(
                            "invalid",
                            "output differs from the majority of candidates' "
                            f"({len(largest)} of {voting} agree)",
                        )
        elif voting == 1:
            self._no_majority = "only one candidate ran, so no majority could vote"
        else:
            sizes = sorted((len(g) for g in groups), reverse=True)
            self._no_majority = (
                f"the {voting} candidates that ran did not agree (groups of {sizes}), "
                "so no majority could vote"
            )

    def validated_by(self, ref: Candidate | None) -> str:
        """What outputs were compared with ("" when nothing could be)."""
        if not self._enabled:
            return ""
        if self._expected is not None:
            return "the reference implementation"
        if ref is not None and ref.ok:
            if self._expected_error is not None:  # e.g. it would not fit in memory
                return f"the heuristic config (the reference implementation failed: {self._expected_error})"
            return "the heuristic config"
        if self._majority is not None:
            agreeing, voting = self._majority
            return f"the majority of candidates ({agreeing} of {voting} agree)"
        return ""

    def why_not(self, ref: Candidate | None) -> str:
        """Why outputs could not be validated although validation is on ("" when they
        were)."""
        if not self._enabled or self.validated_by(ref):
            return ""
        reasons = []
        if ref is None:
            reasons.append("there is no heuristic config")
        elif not ref.ok:
            reasons.append(f"the heuristic config failed ({ref.status}: {ref.error})")
        if self._expected_error is not None:
            reasons.append(f"the reference implementation failed ({self._expected_error})")
        else:
            reasons.append("the kernel declares no reference implementation")
        if self._no_majority:
            reasons.append(self._no_majority)
        return " and ".join(reasons)

    def close(self) -> None:
        self._groups = []  # the representative outputs hold device memory
