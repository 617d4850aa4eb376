"""Call keys: stable across processes, sensitive to shape, dtype and static values."""

import dataclasses
import enum
import functools
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune._src.kernel.base import make_invocation


class Dummy(kt.Kernel):
    op_id = "dummy"


def key(*args, **kwargs):
    return make_invocation(Dummy(), args, kwargs).call_key


KEY_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, kerneltune as kt
    from kerneltune._src.kernel.base import make_invocation
    class Dummy(kt.Kernel):
        op_id = "dummy"
    def act(x):
        return x
    x = jnp.ones((4, 8), jnp.bfloat16)
    inv = make_invocation(Dummy(), (x, jax.ShapeDtypeStruct((3,), jnp.int32)),
                          {"causal": True, "alpha": 2.5, "act": act, "dtype": jnp.float32})
    print(inv.call_key)
    """
)


def test_call_key_is_the_same_in_two_processes(tmp_path, capsys):
    script = tmp_path / "key_script.py"
    script.write_text(KEY_SCRIPT)
    there = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.strip()
    # The other process is this one (its own hash seed and object addresses), running
    # the script as the child did, as `__main__`: a second child cost seconds of
    # starting Python and JAX.
    exec(compile(KEY_SCRIPT, str(script), "exec"), {"__name__": "__main__"})
    here = capsys.readouterr().out.strip()
    assert here == there and len(here) == 32


def test_call_key_differs_by_shape_dtype_and_static_values():
    x = jnp.ones((4, 8))
    base = key(x, causal=True)
    assert key(jnp.ones((4, 8)), causal=True) == base  # values do not matter
    assert (
        key(jax.ShapeDtypeStruct((4, 8), jnp.float32), causal=True) == base
    )  # abstract == concrete
    assert key(jnp.ones((4, 9)), causal=True) != base
    assert key(jnp.ones((4, 8), jnp.bfloat16), causal=True) != base
    assert key(x, causal=False) != base
    assert key(x) != base
    assert key(x, causal=True, alpha=1.0) != base


def test_stable_json_has_no_addresses_or_paths():
    def named(x):
        return x

    class Mode(enum.Enum):
        A = 1

    text = kt.stable_json(
        {
            "f": named,
            "p": functools.partial(named, 1),
            "m": Mode.A,
            "dt": np.float32,
            "d": jnp.bfloat16,
        }
    )
    assert "0x" not in text and "/" not in text
    assert "test_keys" in text  # the function is named by module and qualname


def test_stable_json_rejects_unknown_objects_with_a_clear_message():
    class Opaque:
        pass

    with pytest.raises(
        TypeError, match=r"cannot encode a value of type 'test_stable_json.*Opaque'.*key_builder"
    ):
        kt.stable_json({"x": Opaque()})


def test_stable_json_tells_integer_keys_from_string_keys():
    # Before: {1: x} and {"1": x} had one encoding, and {1: 2, "1": 3} lost an entry.
    assert kt.stable_json({1: 2}) != kt.stable_json({"1": 2})
    both = kt.stable_json({1: 2, "1": 3})
    assert "2" in both and "3" in both
    assert kt.stable_json({2: "a", 1: "b"}) == kt.stable_json({1: "b", 2: "a"})
    assert kt.stable_json({"b": 1, "a": 2}) == '{"__dict__":{"a":2,"b":1}}'  # unchanged


def test_stable_json_keys_callable_objects_by_type_and_name_or_attributes():
    # Before: a callable object (a jnp.ufunc, an instance with __call__) could not be a
    # static argument ("cannot encode a value of type ...").
    class Scaled:
        def __init__(self, a):
            self.a = a

        def __call__(self, x):
            return self.a * x

    assert kt.stable_json(Scaled(2.0)) == kt.stable_json(Scaled(2.0))
    assert kt.stable_json(Scaled(2.0)) != kt.stable_json(Scaled(3.0))
    assert kt.stable_json(jnp.maximum) != kt.stable_json(jnp.minimum)
    assert "0x" not in kt.stable_json(functools.partial(jnp.maximum, 0.0))


def test_stable_json_is_order_independent():
    assert kt.stable_json({"a": 1, "b": 2}) == kt.stable_json({"b": 2, "a": 1})


def test_config_json_round_trip_keeps_types():
    @dataclasses.dataclass(frozen=True)
    class Nested:
        fwd: kt.FwdParams
        bwd: kt.BwdParams
        shape: tuple[int, int] = (1, 2)

    cfg = Nested(
        kt.FwdParams(q_blocksize=64, kv_blocksize=128, num_warps=4, num_stages=2),
        kt.BwdParams(q_blocksize=32),
    )
    back = kt.from_json(kt.to_json(cfg), Nested)
    assert back == cfg and type(back.fwd) is kt.FwdParams and back.shape == (1, 2)


def test_config_json_round_trip_keeps_none_in_an_object_field():
    # `object` admits every value, None included: a config holding None there must
    # load back (a persisted entry would otherwise be skipped and retuned every run).
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Loose:
        extra: object = None
        block: int = 8

    assert kt.from_json(kt.to_json(Loose()), Loose) == Loose()
    assert kt.from_json(kt.to_json(Loose(extra=3)), Loose) == Loose(extra=3)


def test_from_json_of_text_that_is_not_json_names_the_argument():
    # Before: "it is not valid JSON (...)", with no word of which argument "it" was.
    with pytest.raises(
        ValueError, match=r"from_json\(s, FwdParams\): s is unreadable: it is not valid JSON"
    ):
        kt.from_json("{", kt.FwdParams)


def test_from_json_names_unknown_fields():
    with pytest.raises(TypeError, match=r"FwdParams has no field\(s\) \['block'\]"):
        kt.from_json('{"block": 3}', kt.FwdParams)


def test_params_validate_powers_of_two():
    with pytest.raises(
        ValueError, match=r"FwdParams.q_blocksize must be a positive power of two, got 48"
    ):
        kt.FwdParams(q_blocksize=48)
    assert hash(kt.BwdParams(q_blocksize=64)) == hash(kt.BwdParams(q_blocksize=64))


def test_sharding_fingerprint_and_key_builder_with_sharding():
    mesh = jax.make_mesh((4,), ("x",))
    sharded = jax.device_put(
        jnp.ones((8, 4)), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    )
    single = jnp.ones((8, 4))
    assert "x=4" in kt.sharding_fingerprint(sharded)
    assert kt.sharding_fingerprint(single) == "single"
    a = make_invocation(Dummy(), (sharded,), {})
    b = make_invocation(Dummy(), (single,), {})
    assert a.call_key == b.call_key  # the default key ignores sharding
    assert kt.default_key_builder_with_sharding(a) != kt.default_key_builder_with_sharding(b)


def test_custom_key_builder_is_used():
    class Keyed(kt.Kernel):
        op_id = "keyed"

        @staticmethod
        def key_builder(inv):
            return f"rows={inv.args[0].shape[0]}"

    inv = make_invocation(Keyed(), (jnp.ones((5, 2)),), {})
    assert inv.call_key == "rows=5"


def test_a_key_builder_written_as_a_method_is_called_with_the_kernel():
    # Every other hook is a method (`heuristic_cfg(self, inv)`): a key builder written
    # the same way gets its kernel, as it would in a plain class, instead of failing
    # with "missing 1 required positional argument".
    class Keyed(kt.Kernel):
        op_id = "keyed_method"

        def __init__(self, tile):
            super().__init__()
            self.tile = tile

        def key_builder(self, inv):
            return f"rows={inv.args[0].shape[0]},tile={self.tile}"

    class Plain(kt.Kernel):
        op_id = "keyed_plain"

        def key_builder(inv):  # a plain function of the invocation, as SPEC writes it
            return f"rows={inv.args[0].shape[0]}"

    x = jnp.ones((5, 2))
    assert make_invocation(Keyed(8), (x,), {}).call_key == "rows=5,tile=8"
    assert make_invocation(Plain(), (x,), {}).call_key == "rows=5"


def test_signature_names_functions_and_types_without_addresses():
    # A function's repr carried its memory address into the readable signature, which
    # `kerneltune cache ls`, `explain` and every stored entry show:
    # "act=<PjitFunction of <function tanh at 0x7f...>>".
    x = jnp.ones((4, 4))

    def mine(v):
        return v

    inv = make_invocation(
        Dummy(), (x,), {"act": jax.nn.relu, "fn": jnp.tanh, "dtype": jnp.bfloat16, "f": mine}
    )
    assert "0x" not in inv.signature
    assert inv.signature == (
        "f32[4,4], act=relu, dtype=bfloat16, "
        "f=test_signature_names_functions_and_types_without_addresses.<locals>.mine, fn=tanh"
    )
    other = make_invocation(Dummy(), (x,), {"alpha": 0.5, "mode": "fast", "axes": (0, 1)})
    assert other.signature == "f32[4,4], alpha=0.5, axes=(0, 1), mode='fast'"
