"""`kerneltune/_src/kernel/backends.py`: an op's backends as objects, the interpreter
as an option, what runs where a Pallas lowering is missing; and the backend-tagged
config (`kerneltune/kernels/_config.py`), old field names included."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

import kerneltune as kt
from kerneltune import kernels
from kerneltune._src.core import jax_compat
from kerneltune._src.core.configs import config_from_dict
from kerneltune._src.kernel import contract, methods
from kerneltune._src.kernel.backends import BackendKernel
from kerneltune._src.kernel.base import make_invocation
from kerneltune.kernels import GLUConfig, MatmulConfig, SoftmaxConfig
from kerneltune.kernels._common import relative_error
from kerneltune.kernels.matmul import api as matmul_api
from tests.helpers import rand
from tests.kernels.test_api import KERNELS

PUBLIC = KERNELS  # every bundled kernel class


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: c.__name__)
def test_every_bundled_kernel_declares_its_backends_and_names_its_hooks(cls):
    assert issubclass(cls, BackendKernel)
    names = [b.name for b in cls.backends]
    assert len(set(names)) == len(names) and cls.fallback in names
    assert cls.backend_named(cls(), cls.fallback).plain_jax
    # The record's hooks are the kernel's own methods, named, never found by a name
    # built from strings: every platform and context gets the same functions.
    record = methods.methods_of(cls())
    assert record.run is cls.run and record.vjp is cls.vjp
    assert record.heuristic_cfg is cls.heuristic_cfg and record.candidates is cls.candidate_cfgs
    assert record.differentiated_by_jax is cls.differentiated_by_jax
    assert set(contract.HOOKS) <= {f.name for f in dataclasses.fields(record)}


def test_the_contract_lists_every_hook_the_record_holds():
    fields = {f.name for f in dataclasses.fields(contract.KernelMethods)}
    assert fields == {*contract.HOOKS, "platform", "device", "context", "config_type"}
    for hook in ("run", "heuristic_cfg", "candidate_cfgs", "vjp", "config_unusable"):
        assert f"`{hook}`" in contract.__doc__


def test_the_interpreter_is_an_option_with_its_own_op_ids():
    plain, interpreted = kernels.RaggedDot(), kernels.RaggedDot(interpret=True)
    assert (plain.op_id, interpreted.op_id) == ("ragged_dot", "ragged_dot-interpret")
    assert interpreted.grad_lhs.op_id == "ragged_dot_dlhs-interpret"
    assert kernels.RaggedDotInterpret().op_id == "ragged_dot-interpret"
    # Another process rebuilds it from the manifest's constructor arguments.
    assert interpreted.manifest_kwargs() == {"interpret": True}
    assert plain.manifest_kwargs() == {} and kernels.Matmul("mm").manifest_kwargs() == {
        "op_id": "mm"
    }


def test_a_config_of_an_undeclared_backend_says_which_exist():
    kernel = kernels.RaggedDotGradLhs(interpret=True)
    x = jnp.ones((32, 16))
    inv = make_invocation(kernel, (x, jnp.ones((2, 8, 16)), jnp.array([16, 16])), {})
    reason = kernel.config_unusable(inv, kernels.RaggedDotConfig(backend="tokamax"))
    assert "no backend 'tokamax'" in reason and "'triton'" in reason


@pytest.fixture
def no_triton_lowering(monkeypatch):
    """A GPU's platform whose JAX has no Pallas Triton lowering (as after its removal):
    Pallas runs, not in the interpreter, and the Triton lowering is missing."""
    monkeypatch.setitem(
        jax_compat._lowering_missing, "triton", "JAX 0.99 has no Pallas triton lowering"
    )
    monkeypatch.setattr(BackendKernel, "runs_pallas", lambda self: True)
    monkeypatch.setattr(BackendKernel, "use_interpreter", lambda self: False)
    monkeypatch.setattr(matmul_api, "is_hopper", lambda: False)


def test_triton_candidates_are_pruned_with_a_reason_without_the_triton_lowering(
    no_triton_lowering,
):
    kernel = kernels.Matmul()
    x = jnp.ones((256, 256), jnp.bfloat16)
    inv = make_invocation(kernel, (x, x), {})
    kept = kernel.candidate_cfgs(inv)
    assert kept == [matmul_api.XLA]
    # Each Triton config the space keeps is pruned, with the reason.
    space = [c for c in kernel.search_space(inv)[0] if c.backend == "triton"]
    why = {p.cfg: p.reason for p in kernel.pruned_cfgs(inv)}
    assert space and all(why[c] == "JAX 0.99 has no Pallas triton lowering" for c in space)


def test_every_op_still_runs_without_the_triton_lowering(no_triton_lowering):
    # Softmax's configs are its Triton kernel's: the fallback (XLA) runs them.
    kernel = kernels.Softmax()
    assert kernel.backend_of(SoftmaxConfig()).name == "xla"
    x = rand((8, 128), seed=0)
    policy = kt.AutotunePolicy(cache_miss_fallback="heuristics")
    ex = kt.Executor(kt.ConfigSelectorChain(kt.ConfigCache(), policy=policy))
    assert relative_error(ex(kernel, x), jax.nn.softmax(x)) <= 1e-6
    # A config asked for by name is refused with the reason, not run by another backend.
    with pytest.raises(ValueError, match="no Pallas triton lowering"):
        ex(kernel, x, cfg=SoftmaxConfig())


def test_the_lowering_check_names_what_is_missing(monkeypatch):
    assert jax_compat.pallas_lowering_missing("triton") is None  # this JAX has it
    monkeypatch.setattr(jax_compat, "_PALLAS_LOWERINGS", {"triton": "jax._no_such_module"})
    monkeypatch.setattr(jax_compat, "_lowering_missing", {})
    reason = jax_compat.pallas_lowering_missing("triton")
    assert f"JAX {jax.__version__} has no Pallas triton lowering" in reason


def test_configs_stored_with_the_old_block_names_still_load():
    stored = {"backend": "triton", "bm": 64, "bn": 32, "bk": 16, "num_warps": 4}
    stored |= {"num_stages": 3, "group_m": 8}
    cfg = config_from_dict(stored, MatmulConfig)
    assert cfg == MatmulConfig(block_m=64, block_n=32, block_k=16)
    glu = config_from_dict(json.loads('{"backend": "triton", "bm": 128}'), GLUConfig)
    assert glu.block_m == 128 and glu.block_n == 64


def test_the_shipped_tables_hold_old_names_and_load_as_new_ones():
    from kerneltune._src.caching.shipped import package_tables

    tables = package_tables()
    old = [
        (kind, key)
        for (kind, op, key), entry in tables._index().items()
        if op == "matmul@v3" and "bm" in entry.cfg
    ]
    assert old, "the shipped tables hold matmul configs stored under the old names"
    kind, key = old[0]
    cfg = tables.get(f"{kind}|cuda", "matmul@v3", key, MatmulConfig)
    assert (
        isinstance(cfg, MatmulConfig)
        and cfg.block_m == tables.get_entry(f"{kind}|cuda", "matmul@v3", key).cfg["bm"]
    )


def test_a_backend_config_refuses_another_backends_fields_and_shows_its_own():
    with pytest.raises(ValueError, match=r"GLUConfig.block_m is a field of backend='triton'"):
        GLUConfig(block_m=64)
    with pytest.raises(ValueError, match=r"MatmulConfig.backend must be one of \('triton'"):
        MatmulConfig(backend="cuda")
    assert repr(GLUConfig(backend="xla_split")) == "GLUConfig(backend='xla_split')"
    assert repr(kernels.RaggedDotConfig(backend="tokamax")) == "RaggedDotConfig(backend='tokamax')"
    assert kernels.CrossEntropyConfig(backend="chunked").lse_backend == "xla"


def test_jaxs_triton_deprecation_reaches_the_log_once(monkeypatch, caplog):
    # JAX warns on every Pallas Triton lowering, and a `catch_warnings` anywhere makes
    # Python show a warning again: kerneltune says it once and silences JAX's.
    import warnings

    monkeypatch.setattr(jax_compat, "_triton_notice_shown", False)
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        monkeypatch.setattr(warnings, "showwarning", lambda *a, **k: shown.append(a[0]))
        for _ in range(4):
            jax_compat.show_triton_deprecation_once()
            with warnings.catch_warnings():  # as JAX and libraries do
                pass
            message = jax_compat.TRITON_DEPRECATION + " and will be removed"
            warnings.warn(message, DeprecationWarning, stacklevel=1)
    assert shown == []
    notices = [r for r in caplog.records if "deprecates Pallas's Triton" in r.getMessage()]
    assert len(notices) == 1


def test_interpreted_op_ids_still_name_their_config_type():
    # Stored entries of "matmul-interpret@v3" are typed like the class's own (`cache
    # prune`, a lowered program's configs, `kerneltune explain matmul-interpret`).
    from kerneltune._src.cli.cache_commands import _config_types
    from kerneltune._src.kernel.backends import served_op_ids
    from kerneltune._src.workflows.lowered_configs import _config_type_of

    assert served_op_ids(kernels.Matmul) == ("matmul", "matmul-interpret")
    assert _config_type_of("matmul-interpret@v3") is MatmulConfig
    assert _config_types()["ragged_dot_dlhs-interpret@v1"] is kernels.RaggedDotConfig
