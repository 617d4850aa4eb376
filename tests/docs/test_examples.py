"""The examples (issue 19): each model trains to the same losses with `jax.nn` ops and
with kerneltune's, at tiny sizes on the CPU, and its script runs end to end."""

import jax
import numpy as np
import pytest

from examples.gpt_equinox import train as gpt
from examples.llama_nnx import train as llama


@pytest.fixture(autouse=True)
def standard_promotion():
    """optax mixes Python floats and int32 step counts: standard promotion, as users run
    it (the test suite is strict elsewhere)."""
    with jax.numpy_dtype_promotion("standard"):
        yield


@pytest.mark.parametrize("example", [llama, gpt], ids=["llama_nnx", "gpt_equinox"])
def test_the_script_trains_tunes_and_times_both_ways(example, capsys):
    times = example.main(["--steps", "3", "--tiny"])
    out = capsys.readouterr().out
    assert set(times) == {"jax.nn", "kerneltune"} and all(t > 0 for t in times.values())
    losses = [
        [float(v) for v in line.split(":")[1].split()]
        for line in out.splitlines()
        if "losses:" in line
    ]
    assert len(losses) == 2 and losses[0][-1] < losses[0][0]  # it trains
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)  # kerneltune == jax.nn
    assert "kerneltune tuned" in out
