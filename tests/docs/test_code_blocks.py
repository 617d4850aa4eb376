"""Every Python code block in README.md and docs/ runs, in order, one namespace per page,
as a reader would run them (issue 19). Blocks assert what the text around them claims;
`text`, `sh` and `console` blocks are not run."""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import pytest

from tests.helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.M | re.S)


def code_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    """`(line, source)` of each ```python block, indentation (list items) removed."""
    text = path.read_text()
    found = []
    for m in BLOCK.finditer(text):
        indent = len(m.group(1))
        source = "\n".join(line[indent:] for line in m.group(2).splitlines())
        found.append((text.count("\n", 0, m.start()) + 2, source))
    return found


def test_every_page_with_code_is_collected():
    assert sum(len(code_blocks(p)) for p in PAGES) >= 10
    assert code_blocks(ROOT / "README.md")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_code_blocks_of_a_page_run(page, tmp_path, monkeypatch):
    blocks = code_blocks(page)
    if not blocks:
        pytest.skip("no Python code on this page")
    if "<!-- docs-test: own-process" in page.read_text():
        return _run_in_own_process(page, blocks, tmp_path)
    monkeypatch.chdir(tmp_path)  # files the examples write land here
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    # Users run with JAX's default (standard) dtype promotion.
    with jax.numpy_dtype_promotion("standard"):
        for line, source in blocks:
            try:
                exec(compile(source, f"{page.name}:{line}", "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"{page.name}: the block at line {line} failed: {e!r}") from e


def _run_in_own_process(page, blocks, tmp_path):
    """A page whose code must start a process (`jax.distributed.initialize()` before
    any JAX computation) runs in a fresh Python, as a reader's script would."""
    script = tmp_path / "page.py"
    script.write_text(
        "".join(
            f"exec(compile({source!r}, {f'{page.name}:{line}'!r}, 'exec'))\n"
            for line, source in blocks
        )
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    env["KERNELTUNE_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, textwrap.shorten(proc.stderr[-3000:], 3000)
