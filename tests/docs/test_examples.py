"""The examples (issues 19, 47): each model trains to the same losses with `jax.nn` ops
and with kerneltune's, at tiny sizes on the CPU, and its script prints each variant's
first call, steady step and total apart, and the ratio of the steps."""

import re

import jax
import numpy as np
import pytest

from examples.gpt_equinox import train as gpt
from examples.llama_nnx import train as llama
from examples.moe import train as moe


@pytest.fixture(autouse=True)
def standard_promotion():
    """optax mixes Python floats and int32 step counts: standard promotion, as users run
    it (the test suite is strict elsewhere)."""
    with jax.numpy_dtype_promotion("standard"):
        yield


def first_calls_and_steps(out: str, names: tuple[str, str]) -> dict[str, tuple[float, float]]:
    """Each variant's printed first call (s) and steady step (ms), from their own lines;
    asserts that the ratio line agrees with the steps printed."""
    found = {}
    for name in names:
        first = re.search(rf"^ *{re.escape(name)} first call: ([\d.]+) s \((.+)\)$", out, re.M)
        step = re.search(rf"^ *{re.escape(name)} steady step: ([\d.]+) ms$", out, re.M)
        total = re.search(
            rf"^ *{re.escape(name)} \d+ steps, first call included: ([\d.]+) s$", out, re.M
        )
        assert first and step and total, out
        assert float(total.group(1)) >= float(first.group(1))
        found[name] = (float(first.group(1)), float(step.group(1)))
    ratio = re.search(rf"^steady step, {re.escape(names[0])} ÷ kerneltune: ([\d.]+)x", out, re.M)
    assert ratio, out
    want = found[names[0]][1] / found["kerneltune"][1]
    assert float(ratio.group(1)) == pytest.approx(want, rel=0.05, abs=0.01)
    return found


def losses_of(out: str) -> list[list[float]]:
    return [
        [float(v) for v in line.split(":")[1].split()]
        for line in out.splitlines()
        if "losses:" in line
    ]


@pytest.mark.parametrize("example", [llama, gpt], ids=["llama_nnx", "gpt_equinox"])
def test_the_script_trains_and_prints_first_call_and_steady_step_both_ways(example, capsys):
    times = example.main(["--steps", "3", "--tiny"])
    out = capsys.readouterr().out
    assert set(times) == {"jax.nn", "kerneltune"} and all(t > 0 for t in times.values())
    losses = losses_of(out)
    assert len(losses) == 2 and losses[0][-1] < losses[0][0]  # it trains
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)  # kerneltune == jax.nn
    found = first_calls_and_steps(out, ("jax.nn", "kerneltune"))
    # The steady step printed is the one returned.
    for name, (_, step_ms) in found.items():
        assert step_ms == pytest.approx(times[name] * 1e3, abs=0.006)
    assert "kt.autotune" not in out  # the first call tunes, as any program's does
    assert "the first-call budget" in out


def test_autotune_runs_before_the_first_call_and_is_printed_apart(capsys):
    gpt.main(["--steps", "1", "--tiny", "--autotune"])
    out = capsys.readouterr().out
    found = re.search(
        r"^kerneltune kt.autotune\(step\): (\d+) of (\d+) kernel calls tuned in [\d.]+ s", out, re.M
    )
    assert found, out
    # Every kernel call is listed; on a CPU none has anything to tune (the ops run XLA).
    tuned, listed = int(found.group(1)), int(found.group(2))
    assert listed > 0 and (tuned == 0 or jax.default_backend() != "cpu")
    assert out.index("kt.autotune") < out.index("kerneltune first call")
    first_calls_and_steps(out, ("jax.nn", "kerneltune"))


def test_the_moe_script_prints_first_call_and_steady_step_both_ways(capsys):
    times = moe.main(["--steps", "2", "--tiny"])
    out = capsys.readouterr().out
    assert set(times) == {"jax", "kerneltune"}
    first_calls_and_steps(out, ("jax", "kerneltune"))
