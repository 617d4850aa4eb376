"""The bounded JSON reader: its nesting and integer limits, exact on any valid JSON
(strings holding brackets, quotes and backslashes included)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerneltune._src.core import files

#: Strings made of the bytes that confuse a bracket count: brackets, quotes, escapes.
TRICKY = st.text(alphabet='[]{}"\\\\ab\n', max_size=8)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**70), 10**70) | TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=30,
)


def depth(value) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(JSON, st.integers(0, 6))
def test_the_depth_check_is_exact_on_valid_json(value, limit):
    data = json.dumps(value).encode()
    assert files._depth_ok(data, limit) == (depth(value) <= limit)


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_loads_accepts_what_is_within_the_limits_and_names_a_long_integer(value):
    data = json.dumps(value)
    digits = [len(str(abs(v))) for v in _ints(value)]
    if any(d > files.MAX_INT_DIGITS for d in digits):
        with pytest.raises(files.UnreadableFile, match="digit integer"):
            files.loads(data)
    else:
        assert files.loads(data) == value


def _ints(value):
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _ints(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _ints(v)


def test_a_long_run_of_digits_in_a_string_or_a_float_is_no_integer():
    text = "7" * 100
    assert files.loads(json.dumps({"s": text, "f": 1.5})) == {"s": text, "f": 1.5}
    assert files.loads('{"f": 0.' + text + "}")["f"] == float("0." + text)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "hostile",
    [
        # One string never closed, full of escaped quotes, brackets inside it.
        b'"' + b'\\"' * 500_000 + b"[" * 70,
        b'""' * 1_000_000 + b"[" * 70,  # a million strings, then too deep
        b"[]" * 1_000_000,  # brackets that never nest, a million of them
        b"[" + (b"1" * 64 + b",") * 30_000 + b"1]",  # runs of digits just short enough
    ],
)
def test_the_checks_cost_memory_and_time_in_proportion_to_the_file(hostile):
    """The reader guards a shared directory anyone may write to: no file within the
    size limit may make its checks quadratic, or hold an object per string, bracket
    or number while checking (a list of a million pieces takes tens of MB)."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(files.UnreadableFile):
            files.loads(hostile + b"]")  # each made invalid, so that all of it is read
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(hostile) + (2 << 20), peak
