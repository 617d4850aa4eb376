"""Labels survive into the lowered module, its HLO and the compiled HLO, under jit,
grad and vmap, and parse back into (op, call key)."""

import json

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune._src.core import labels, options
from tests.helpers import heuristics_executor, rand
from tests.offline_kernels import HEURISTIC, LoopKernel, SinKernel


def three_texts(lowered):
    return {
        "stablehlo": lowered.as_text(),
        "hlo": lowered.compiler_ir("hlo").as_hlo_text(),
        "compiled": lowered.compile().as_text(),
    }


def two_call_model(ex, kernel):
    def model(x):
        y = ex(kernel, x, alpha=2.0)
        z = ex(kernel, y[:8, :8])
        return jnp.sum(jnp.sin(z)) + jnp.sum(jnp.cos(y))

    return model


def expected_keys(ex, kernel, x):
    """The (op_id_v, call_key) of the model's two calls, as the executor computes them."""
    inv1 = ex.invocation(kernel, x, alpha=2.0)
    inv2 = ex.invocation(kernel, x[:8, :8])
    return {(inv1.op_id_v, inv1.call_key), (inv2.op_id_v, inv2.call_key)}


def found_keys(text):
    out = set()
    for lab in labels.extract_labels_from_hlo_text(text):
        parsed = labels.parse_label(lab)
        if parsed is not None:
            out.add((parsed.op_id_v, parsed.call_key))
    return out


@pytest.mark.parametrize("transform", ["jit", "grad", "vmap"])
def test_two_calls_found_in_all_three_texts(transform):
    ex, kernel = heuristics_executor(), LoopKernel()
    model = two_call_model(ex, kernel)
    x = rand((16, 16), seed=0)
    want = expected_keys(ex, kernel, x)
    assert len(want) == 2
    if transform == "jit":
        lowered = jax.jit(model).lower(x)
    elif transform == "grad":
        lowered = jax.jit(jax.grad(model)).lower(x)
    else:
        lowered = jax.jit(jax.vmap(model)).lower(jnp.stack([x, x, x]))
    for name, text in three_texts(lowered).items():
        assert found_keys(text) == want, name
    assert {(lab.op_id_v, lab.call_key) for lab in labels.kernel_labels_in_lowered(lowered)} == want


def test_backward_kernel_has_its_own_label_under_grad():
    ex = heuristics_executor()
    fwd = SinKernel(executor=ex)

    def loss(x):
        return jnp.sum(ex(fwd, x) ** 2)

    x = rand((8, 8), seed=1)
    lowered = jax.jit(jax.value_and_grad(loss)).lower(x)
    for name, text in three_texts(lowered).items():
        ops = {op for op, _ in found_keys(text)}
        assert ops == {"sin_fwd@v0", "sin_bwd@v0"}, name


def test_json_stamp_keeps_quotes_in_every_text():
    ex, kernel = heuristics_executor(), LoopKernel()
    x = rand((8, 8), seed=2)
    with options.scoped(stamp="json"):
        lowered = jax.jit(lambda x: ex(kernel, x)).lower(x)
        texts = three_texts(lowered)
    for name, text in texts.items():
        (found,) = labels.extract_labels_from_hlo_text(text)
        parsed = labels.parse_label(found)
        assert parsed is not None, name
        assert json.loads(parsed.cfg_json) == {"reps": HEURISTIC.reps}, name


def test_no_labels_when_stamping_is_off():
    ex, kernel = heuristics_executor(), LoopKernel()
    x = rand((8, 8), seed=3)
    with options.scoped(stamp="none"):
        lowered = jax.jit(lambda x: ex(kernel, x)).lower(x)
    assert kt.find_labels_in_lowered(lowered) == []
    no_stamp = jax.jit(lambda x: ex(kernel, x, stamp=False)).lower(x)
    assert kt.find_labels_in_lowered(no_stamp) == []


def test_label_decorator_in_every_text():
    @kt.label("my_block:v2@x")
    def block(x):
        return jnp.sin(x) * 3.0

    lowered = jax.jit(block).lower(jnp.ones(4))
    for name, text in three_texts(lowered).items():
        assert kt.extract_labels_from_hlo_text(text) == ["my_block:v2@x"], name
    assert kt.find_labels_in_lowered(lowered.compile()) == ["my_block:v2@x"]
    assert labels.parse_label("my_block:v2@x") is None


def test_extract_decodes_both_escape_styles():
    hlo = 'HloModule m\n  %a = f32[] add(), frontend_attributes={kerneltune_label="p:op@v1:k:{\\"b\\":2}"}'
    mlir = 'module @m {\n  %0 = stablehlo.add {mhlo.frontend_attributes = {kerneltune_label = "p:op@v1:k:{\\22b\\22:2}"}}'
    assert kt.extract_labels_from_hlo_text(hlo) == ['p:op@v1:k:{"b":2}']
    assert kt.extract_labels_from_hlo_text(mlir) == ['p:op@v1:k:{"b":2}']


def test_parse_label_keeps_colons_in_the_op_id():
    parsed = labels.parse_label('kerneltune:ns:op@v3:abc123:{"a":1}')
    assert (parsed.prefix, parsed.op_id_v, parsed.call_key, parsed.cfg_json) == (
        "kerneltune",
        "ns:op@v3",
        "abc123",
        '{"a":1}',
    )
    assert parsed.text == 'kerneltune:ns:op@v3:abc123:{"a":1}'


def test_a_custom_call_key_with_colons_survives_the_label():
    # A key_builder may return any string; a ':' in it cut the parsed key short, so
    # offline tuning silently looked up a key no call has.
    class Keyed(LoopKernel):
        op_id = "keyed_with_colons"

        @staticmethod
        def key_builder(inv):
            return f"rows:{inv.args[0].shape[0]}:100%3A"

    ex, kernel = heuristics_executor(), Keyed()
    x = rand((16, 16), seed=0)
    inv = ex.invocation(kernel, x)
    lowered = jax.jit(lambda x: ex(kernel, x)).lower(x)
    for name, text in three_texts(lowered).items():
        assert found_keys(text) == {(inv.op_id_v, "rows:16:100%3A")}, name
    with options.scoped(stamp="json"):
        lowered = jax.jit(lambda x: ex(kernel, x)).lower(x)
    (parsed,) = labels.kernel_labels_in_lowered(lowered)
    assert parsed.call_key == "rows:16:100%3A" and json.loads(parsed.cfg_json) == {"reps": 6}


def test_labels_to_configs_reads_the_caches():
    ex, kernel = heuristics_executor(), LoopKernel()
    x = rand((8, 8), seed=4)
    lowered = jax.jit(lambda x: ex(kernel, x)).lower(x)
    assert kt.labels_to_configs(lowered, ex.chooser) == {}
    ((op, key),) = found_keys(lowered.as_text())
    ex.chooser.cache.put(kt.device_fingerprint(), op, key, HEURISTIC)
    assert kt.labels_to_configs(lowered, ex.chooser) == {(op, key): HEURISTIC}


def test_labels_to_configs_types_persistent_entries_and_skips_invalid_ones(tmp_path, caplog):
    # Issue 12 leftover: persistent entries were returned untyped (a dict), so one that
    # no longer fits its kernel's config type was handed out as a config.
    from tests.offline_kernels import LoopCfg

    class TypedLoop(LoopKernel):
        op_id = "typed_loop_labels"
        config_type = LoopCfg

    persistent = kt.PersistentCache(tmp_path)
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(),
        policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"),
        persistent=persistent,
    )
    x = rand((8, 8), seed=4)
    lowered = jax.jit(lambda x: kt.Executor(chain)(TypedLoop(), x)).lower(x)
    ((op, key),) = found_keys(lowered.as_text())
    persistent.put(kt.device_fingerprint(), op, key, LoopCfg(reps=3))
    assert kt.labels_to_configs(lowered, chain) == {(op, key): LoopCfg(reps=3)}
    persistent.put(kt.device_fingerprint(), op, key, {"reps": "three"})
    assert kt.labels_to_configs(lowered, chain) == {}
    assert "no longer fits LoopCfg (LoopCfg.reps must be an int" in caplog.text


def test_labels_to_configs_takes_the_labels_find_labels_in_lowered_returns():
    # The overview's form, `labels_to_configs(find_labels_in_lowered(lowered))`, raised
    # AttributeError ('list' object has no attribute 'as_text').
    ex, kernel = heuristics_executor(), LoopKernel()
    x = rand((8, 8), seed=4)
    lowered = jax.jit(lambda x: ex(kernel, x)).lower(x)
    found = kt.find_labels_in_lowered(lowered)
    ((op, key),) = found_keys(lowered.as_text())
    ex.chooser.cache.put(kt.device_fingerprint(), op, key, HEURISTIC)
    expected = {(op, key): HEURISTIC}
    assert kt.labels_to_configs(found, ex.chooser) == expected
    assert kt.labels_to_configs((*found, "my_block"), ex.chooser) == expected
    with pytest.raises(TypeError, match=r"labels_to_configs\(lowered=...\).*found 3 \(int\)"):
        kt.labels_to_configs([3], ex.chooser)
    with pytest.raises(TypeError, match=r"lowered computation .*HLO text, got int"):
        kt.find_labels_in_lowered(3)


def test_extracting_labels_from_something_not_text_names_the_argument():
    # Before: "'int' object is not subscriptable", from inside the function.
    with pytest.raises(TypeError, match=r"extract_labels_from_hlo_text\(text\) .*got int \(3\)"):
        kt.extract_labels_from_hlo_text(3)
