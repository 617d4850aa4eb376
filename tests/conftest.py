"""Fixtures shared by the tests (the process-wide setup is in the root conftest.py)."""

import os

import jax
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def random_seed():
    """One random seed per test, printed so a failure can be replayed:
    `KERNELTUNE_TEST_SEED=<seed> pytest <test>` gives the test that seed. NumPy's global
    generator (`tests.helpers.rand`'s seeds) is seeded with it, and `key` is made of it."""
    replay = os.environ.get("KERNELTUNE_TEST_SEED")
    seed = int(replay) if replay else int(np.random.SeedSequence().entropy % (2**31))
    print(f"seed {seed}")
    state = np.random.get_state()
    np.random.seed(seed)
    yield seed
    np.random.set_state(state)


@pytest.fixture
def key(random_seed):
    """The test's random key (from `random_seed`)."""
    return jax.random.PRNGKey(random_seed)


@pytest.fixture
def empty_registry():
    """An empty invocation registry before and after the test."""
    from kerneltune._src.kernel import recording

    recording.clear_invocations()
    yield
    recording.clear_invocations()
