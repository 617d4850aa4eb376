"""Fixtures shared by the tests (the process-wide setup is in the root conftest.py)."""

import jax
import numpy as np
import pytest


@pytest.fixture
def key():
    """A fresh random key per test; the seed is printed so a failure can be replayed."""
    seed = int(np.random.SeedSequence().entropy % (2**31))
    print(f"seed {seed}")
    return jax.random.PRNGKey(seed)


@pytest.fixture
def empty_registry():
    """An empty invocation registry before and after the test."""
    from kerneltune._src.kernel import recording

    recording.clear_invocations()
    yield
    recording.clear_invocations()
