"""Candidates lowered in worker processes (`tuning/lowering_pool.py`): the same programs
as lowered here, validated the same way, and every case a worker cannot take lowered
here instead."""

from __future__ import annotations

import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kerneltune as kt
from kerneltune._src.core import options
from kerneltune._src.kernel import dispatch
from kerneltune._src.tuning import lowering_pool, lowering_worker, programs
from kerneltune._src.tuning.compiling import default_workers
from kerneltune._src.tuning.tuner import Tuner
from kerneltune.kernels._common import kernel_for
from kerneltune.kernels.ragged_dot.api import RaggedDot
from kerneltune.kernels.ragged_dot.config import RaggedDotConfig

CONFIGS = [
    RaggedDotConfig(backend="triton", block_m=bm, block_n=bn, block_k=16, num_warps=4, num_stages=2)
    for bm, bn in itertools.product((16, 32), (16, 32, 64))
]


@pytest.fixture(scope="module")
def pool():
    """Two workers for the module (each start imports JAX in a new process)."""
    pool = lowering_pool.LoweringPool(2)
    assert pool.wait_ready(), pool.failure
    previous, lowering_pool._pool = lowering_pool._pool, pool
    try:
        yield pool
    finally:
        lowering_pool._pool = previous
        pool.close()


@pytest.fixture
def two_workers(pool):
    lowering_pool.lowered_by.clear()
    with options.LOWERING_WORKERS.override(2):
        yield pool


def _operands():
    x = jax.random.normal(jax.random.key(0), (64, 32), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (4, 32, 64), jnp.float32)
    sizes = jnp.array([16, 0, 40, 8], jnp.int32)
    return (x, w, sizes), {"out_dtype": jnp.float32}


def _tune(make_fn, configs=CONFIGS, backward=False):
    args, kwargs = _operands()
    return Tuner(iters=2).tune(
        make_fn, args, kwargs, configs, reference_cfg=configs[0], backward=backward
    )


def test_a_search_lowers_its_candidates_in_the_workers_and_validates_them(two_workers):
    # The kernel as calls use it: bound to the default executor, whose caches and locks
    # stay in this process (before, it did not pickle, and every search lowered here).
    kernel = kernel_for(RaggedDot, kt.default_executor())
    report = _tune(dispatch.KernelFunction(kernel))
    assert lowering_pool.lowered_by == {"worker": len(CONFIGS)}
    # Every output was compared with the reference config's, as for lowerings made here.
    assert [c.status for c in report.candidates] == ["ok"] * len(CONFIGS)
    assert report.best in CONFIGS


def test_a_workers_program_computes_what_the_same_config_lowered_here_does(two_workers):
    (x, w, sizes), kwargs = _operands()
    arrays, rebuild = programs.split_static((x, w, sizes), kwargs)
    make_fn = dispatch.KernelFunction(RaggedDot())
    by_worker = lowering_pool.lowering(
        make_fn, rebuild, arrays, backward=False, candidates=len(CONFIGS)
    )(CONFIGS[3])
    here = programs.lowering(make_fn, rebuild, arrays, backward=False)(CONFIGS[3])
    assert lowering_pool.lowered_by == {"worker": 1}
    got = by_worker.compile()(*arrays)
    assert np.array_equal(np.asarray(got), np.asarray(here.compile()(*arrays)))
    assert np.allclose(got, jax.lax.ragged_dot(x, w, sizes), atol=1e-4)


def _selects_a_config(cfg):
    """A candidate whose program calls a kerneltune op, which chooses its own config."""
    from kerneltune.kernels.softmax import softmax

    inner = dispatch.KernelFunction(RaggedDot())(cfg)
    return lambda x, w, sizes, **kw: softmax(inner(x, w, sizes, **kw))


def test_a_program_whose_kernels_choose_a_config_is_lowered_here(two_workers):
    # In a worker the choice would ignore this process's caches and tunings.
    report = _tune(_selects_a_config)
    (why,) = lowering_pool.lowered_by
    assert why.startswith("here: SelectionInWorker: 'softmax' chooses a config")
    assert lowering_pool.lowered_by.total() == len(CONFIGS)
    assert [c.status for c in report.candidates] == ["ok"] * len(CONFIGS)


def _ends_its_worker(cfg):
    if lowering_worker.in_worker():
        os._exit(3)
    return dispatch.KernelFunction(RaggedDot())(cfg)


def test_a_worker_that_dies_is_replaced_and_its_candidate_lowered_here(two_workers):
    report = _tune(_ends_its_worker, CONFIGS[:6])
    assert [c.status for c in report.candidates] == ["ok"] * 6
    assert lowering_pool.lowered_by.total() == 6
    assert all("a lowering worker ended (exit code 3" in k for k in lowering_pool.lowered_by), (
        lowering_pool.lowered_by
    )
    # Fresh workers answer the next search.
    lowering_pool.lowered_by.clear()
    _tune(dispatch.KernelFunction(RaggedDot()))
    assert lowering_pool.lowered_by == {"worker": len(CONFIGS)}


@pytest.mark.parametrize(
    "case",
    ["closure", "backward", "few candidates", "no workers"],
)
def test_what_a_worker_cannot_take_is_lowered_here_as_before(two_workers, case):
    kernel = RaggedDot()
    make_fn = dispatch.KernelFunction(kernel)
    configs, backward = CONFIGS, False
    if case == "closure":
        make_fn = lambda cfg: dispatch.kernel_function(kernel, cfg)  # noqa: E731 (does not pickle)
    elif case == "backward":
        backward = True  # its backward calls kernels whose configs this process chooses
    elif case == "few candidates":
        configs = CONFIGS[: lowering_pool.MIN_CANDIDATES - 1]  # a first call's shortlist
    with options.LOWERING_WORKERS.override(0 if case == "no workers" else 2):
        report = _tune(make_fn, configs, backward)
    if case == "closure":  # said, so that a kernel that should pickle is noticed
        assert lowering_pool.lowered_by == {
            "here: the program does not pickle (AttributeError)": len(configs)
        }
    else:
        assert lowering_pool.lowered_by.total() == 0
    assert [c.status for c in report.candidates] == ["ok"] * len(configs)


def test_the_number_of_workers_is_an_option_with_a_clear_error(monkeypatch):
    monkeypatch.delenv("KERNELTUNE_LOWERING_WORKERS", raising=False)
    assert lowering_pool.configured_workers() == 0  # off unless asked for
    monkeypatch.setenv("KERNELTUNE_LOWERING_WORKERS", "3")
    assert lowering_pool.configured_workers() == 3
    monkeypatch.setenv("KERNELTUNE_LOWERING_WORKERS", "auto")
    many_cores = default_workers() >= lowering_pool.DEFAULT_MIN_CORES
    auto = lowering_pool.DEFAULT_WORKERS if jax.default_backend() == "gpu" and many_cores else 0
    assert lowering_pool.configured_workers() == auto  # none without a CUDA GPU
    monkeypatch.setenv("KERNELTUNE_LOWERING_WORKERS", "-1")
    with pytest.raises(
        ValueError, match=r"KERNELTUNE_LOWERING_WORKERS='-1'.*a whole number >= 0, or auto"
    ):
        lowering_pool.configured_workers()


def test_selection_refuses_to_run_in_a_worker(monkeypatch):
    lowering_worker.refuse_selection("matmul")  # not a worker: nothing happens
    monkeypatch.setattr(lowering_worker, "_in_worker", True)
    with pytest.raises(lowering_worker.SelectionInWorker, match="matmul chooses a config"):
        lowering_worker.refuse_selection("matmul")
    assert lowering_pool.configured_workers() == 0  # a worker starts none of its own
