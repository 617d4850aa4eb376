"""The `KERNELTUNE_*` options as typed objects."""

import pytest

from kerneltune._src.core import options


def test_options_are_typed_objects_with_a_scoped_override(monkeypatch):
    # Issue 14: options were read as options.get("name") -> Any, so a misspelt name
    # failed only when that line ran; now each is an attribute mypy checks.
    monkeypatch.setenv("KERNELTUNE_AGREE_TIMEOUT", "12.5")
    assert options.AGREE_TIMEOUT.value == 12.5
    with options.STAMP.override("none"):
        assert options.STAMP.value == "none" and options.get("stamp") == "none"
    assert options.STAMP.value == "hash"
    with pytest.raises(ValueError, match="allowed: hash, json, none"):
        with options.STAMP.override("bogus"):
            pass
    assert {o.name for o in vars(options).values() if isinstance(o, options.Option)} == {
        "platform", "stamp", "record", "autotune", "cache_dir", "cache_readonly", "agree_timeout", "shipped",
        "first_call_candidates", "first_call_key_s", "first_call_process_s",
        "first_call_trust_prediction",
        "lowering_workers",
    }  # fmt: skip
