"""Every public name imports, and the names SPEC promises are there."""

import kerneltune


def test_every_name_in_all_imports():
    for name in kerneltune.__all__:
        assert getattr(kerneltune, name) is not None, name


def test_all_is_sorted_and_unique():
    assert len(set(kerneltune.__all__)) == len(kerneltune.__all__)


def test_spec_core_names_present():
    required = {
        "Kernel",
        "Invocation",
        "Executor",
        "ConfigChooser",
        "default_executor",
        "set_default_executor",
        "ConfigCache",
        "overlay_cache",
        "AutotunePolicy",
        "ConfigSelectorChain",
        "policy_override",
        "forward_autotune_only",
        "explain",
        "Tuner",
        "FwdParams",
        "BwdParams",
        "AutotuningResult",
        "Entry",
        "label",
        "find_labels_in_lowered",
        "extract_labels_from_hlo_text",
        "labels_to_configs",
        "sharding_fingerprint",
        "default_key_builder_with_sharding",
        "device_kind",
        "get_device_platform",
        "device_fingerprint",
        "to_json",
        "from_json",
        "stable_json",
        "Cfg",
        "Out",
    }
    assert required <= set(kerneltune.__all__)
