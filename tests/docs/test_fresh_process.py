"""`benchmarks/fresh_process.py`: a benchmark's child in a fresh process, which the
first-call benchmarks (`first_use_gpu`, `first_call_breakdown`) run every variant in."""

import sys

from benchmarks import fresh_process


def test_the_child_reads_an_empty_cache_and_its_last_json_line_is_the_result():
    code = (
        "import json, os; print('{not this}'); "
        "d = os.environ['KERNELTUNE_CACHE_DIR']; "
        "print(json.dumps({'empty': os.listdir(d) == [], 'extra': os.environ['EXTRA'], "
        "'cwd': os.getcwd()}))"
    )
    result = fresh_process.json_result(
        [sys.executable, "-c", code], timeout_s=60, env={"EXTRA": "yes"}
    )
    assert result == {"empty": True, "extra": "yes", "cwd": str(fresh_process.ROOT)}


def test_a_child_that_prints_no_result_or_runs_too_long_is_an_error():
    failed = fresh_process.json_result(
        [sys.executable, "-c", "import sys; sys.exit('it broke')"], timeout_s=60
    )
    assert failed == {"error": "rc 1: it broke"}
    late = fresh_process.json_result(
        [sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5
    )
    assert late == {"error": "no result after 0 s"}
