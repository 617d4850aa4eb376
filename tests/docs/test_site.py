"""The docs site's generated pages cannot drift (issue 19): the API reference names
every public name, the command-line page every command, and the nav every page."""

import importlib.util
import re

import kerneltune
import kerneltune.kernels
from kerneltune._src.core import options
from tests.helpers import ROOT


def hook(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_lists_every_public_name():
    text = hook("api_reference").on_page_markdown(
        (ROOT / "docs/api.md").read_text(), None, None, None
    )
    listed = set(re.findall(r"^::: (\S+)$", text, re.M))
    for module in (kerneltune, kerneltune.kernels):
        for name in module.__all__:
            if not name.startswith("_"):
                assert f"{module.__name__}.{name}" in listed, name


def test_the_cli_page_shows_every_command():
    text = hook("cli_reference").on_page_markdown(
        (ROOT / "docs/cli.md").read_text(), None, None, None
    )
    for command in ("info", "demo", "tune", "explain", "report", "cache ls", "cache prune"):
        assert f"## `kerneltune {command}`" in text
    assert "--isolate" in text and "--workers" in text


def test_every_page_in_the_nav_exists_and_every_page_is_in_the_nav():
    nav = re.findall(r"^  - [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert set(nav) == pages


def test_the_readme_lists_every_environment_option_with_its_default():
    """Each `KERNELTUNE_*` option has a row in README.md's table, whose last cell starts
    with its default where the default is a number or a flag."""
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `KERNELTUNE_") and len(cells) == 3:
            rows[cells[0].strip("`")] = cells[2].split()[0].strip("`")
    for name, option in options._OPTIONS.items():
        variable = options.env_name(name)
        assert variable in rows, f"README.md's table of environment options lacks {variable}"
        default = option.default
        if isinstance(default, bool):
            assert rows[variable] == str(int(default)), variable
        elif isinstance(default, (int, float)):
            assert float(rows[variable]) == default, variable
