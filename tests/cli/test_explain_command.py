"""`kerneltune explain` (issue 13): the answer `kt.explain` gives, on the command line."""

import re

import pytest

from kerneltune.cli import main


def explain(capsys, *argv):
    code = main(["explain", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_an_op_call_is_explained_without_benchmarking(capsys, tmp_path):
    code, out, _ = explain(
        capsys, "matmul-interpret", "f32[32,64]", "f32[64,32]", "--cache-dir", str(tmp_path)
    )
    assert code == 0
    assert "matmul-interpret@v3(f32[32,64], f32[64,32]) on cpu" in out
    assert "from:     the kernel's heuristic" in out
    assert "autotune: not allowed by the policy" in out
    assert "pass --tune to benchmark this call now" in out
    assert not list(tmp_path.rglob("*.json"))  # nothing was tuned or written


def test_a_tuned_call_is_explained_from_the_persistent_cache_with_its_timings(capsys, tmp_path):
    call = ["matmul-interpret", "f32[32,64]", "f32[64,32]", "--cache-dir", str(tmp_path)]
    code, out, _ = explain(capsys, *call, "--tune")
    assert code == 0 and "from:     autotuning just now" in out
    key = re.search(r"call key: ([0-9a-f]+)", out).group(1)
    winner = re.search(r"config:   (.*)", out).group(1)
    # A new process (here: a new chain) finds it in the persistent cache.
    code, out, _ = explain(capsys, *call)
    assert code == 0 and "from:     the persistent cache" in out
    assert re.search(r"config:   (.*)", out).group(1) == winner
    assert re.search(r"stored .* \(autotuned\), tuned with the \w+ timer", out)
    assert len(re.findall(r"^   [* ] +[0-9.]+ ms  ", out, re.M)) >= 2  # every candidate
    # The key form gives the same config and the same stored timings.
    code, by_key, _ = explain(capsys, key[:10], "--cache-dir", str(tmp_path))
    assert code == 0 and f"call key: {key}" in by_key
    assert by_key.splitlines()[-2:] == out.splitlines()[-2:]


def test_a_keyword_argument_and_a_bundled_op_without_candidates(capsys, tmp_path):
    code, out, _ = explain(
        capsys, "layer_norm", "f32[8,64]", "f32[64]", "f32[64]", "--kw", "eps=1e-5",
        "--cache-dir", str(tmp_path),
    )  # fmt: skip
    assert code == 0 and "eps=1e-05" in out
    assert "autotune: only plain-JAX backends run on this platform (no Pallas)" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nosuchop", "f32[2]"], "no kernel has the op id 'nosuchop' (bundled: attention"),
        (["deadbeef"], "'deadbeef' is neither an op id"),
        (["matmul", "q8[2,2]", "f32[2,2]"], "unknown dtype 'q8'"),
        (["matmul", "f32[2,2]", "--kw", "2x"], "expected NAME=VALUE"),
        (["matmul", "f32[2,3]", "f32[4,2]"], "matmul: "),
    ],
)
def test_bad_input_is_one_line_and_exit_1(capsys, tmp_path, argv, message):
    code, out, err = explain(capsys, *argv, "--cache-dir", str(tmp_path))
    assert code == 1 and message in err and "Traceback" not in err


def test_arguments_the_kernel_does_not_take_are_named_with_what_it_takes(capsys, tmp_path):
    # Before: "Attention.prepare() got an unexpected keyword argument 'is_causal'", which
    # named neither the op's arguments nor what to write instead.
    qkv = ["f32[2,8,4,16]"] * 3
    code, _, err = explain(
        capsys, "attention", *qkv, "--kw", "is_causal=true", "--cache-dir", str(tmp_path)
    )
    assert code == 1 and "Traceback" not in err
    assert "attention: got an unexpected keyword argument 'is_causal'" in err
    assert "the attention kernel takes (q, k, v, *, causal=False, sm_scale=None)" in err
    code, _, err = explain(capsys, "layer_norm", "f32[8,64]", "--cache-dir", str(tmp_path))
    assert code == 1 and "layer_norm takes x, weight, bias" in err  # the kernel's own check
    code, _, err = explain(capsys, "matmul", "f32[8,64]", "--cache-dir", str(tmp_path))
    assert code == 1 and "missing a required argument: 'y'" in err
    assert "the matmul kernel takes (x, y)" in err


def test_arguments_may_follow_options(capsys, tmp_path):
    # `kerneltune explain matmul-interpret --cache-dir DIR f32[32,64] f32[64,32]` failed
    # with "unrecognized arguments": argparse fills a list of positionals only from the
    # words before the first option.
    code, out, err = explain(
        capsys, "matmul-interpret", "--cache-dir", str(tmp_path), "f32[32,64]", "f32[64,32]"
    )
    assert code == 0, err
    assert "matmul-interpret@v3(f32[32,64], f32[64,32]) on cpu" in out
    code, out, err = explain(
        capsys, "matmul-interpret", "f32[32,64]", "--cache-dir", str(tmp_path), "f32[64,32]"
    )
    assert code == 0 and "(f32[32,64], f32[64,32])" in out
    code, _, err = explain(capsys, "matmul-interpret", "f32[32,64]", "--no-such-option")
    assert code == 2 and "unrecognized arguments: --no-such-option" in err
