"""Builds the virtual environment of `make test-newest-jax`: the newest Python >= 3.12
on this machine with the newest JAX the package registry offers for it.

Run with any Python 3. Prints the venv's Python on its last line. Fails (exit 1) with
what to do when there is no Python >= 3.12, or when the installed JAX is not the newest
release the registry offers (so the job can never quietly test an old JAX).

  NEWEST_PYTHON=/path/to/python3.13   use this interpreter instead of searching
  NEWEST_VENV=.venv-newest-jax        where the venv lives
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

MINIMUM = (3, 12)
VERSION_OF = "import sys; print('%d.%d.%d' % sys.version_info[:3])"


def version_of(python: str) -> tuple[int, ...] | None:
    """The version of the interpreter at `python`, or None when it does not run (a pyenv
    shim of a version that is not active, a broken link)."""
    try:
        out = subprocess.run(
            [python, "-c", VERSION_OF], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return tuple(int(p) for p in out.strip().split("."))


def candidates() -> list[str]:
    found = []
    for minor in range(30, MINIMUM[1] - 1, -1):
        path = shutil.which(f"python3.{minor}")
        if path:
            found.append(path)
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    for root in filter(None, roots):
        found += glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3"))
    found += glob.glob("/usr/bin/python3.*") + glob.glob("/usr/local/bin/python3.*")
    return [p for p in found if re.search(r"python3(\.\d+)?$", p)]


def find_python() -> str:
    override = os.environ.get("NEWEST_PYTHON")
    if override:
        version = version_of(override)
        if version is None or version < MINIMUM:
            sys.exit(
                f"NEWEST_PYTHON={override} is not a working Python >= 3.12 (it reports {version})."
            )
        return override
    best: tuple[tuple[int, ...], str] | None = None
    for path in candidates():
        version = version_of(path)
        if version is not None and version >= MINIMUM and (best is None or version > best[0]):
            best = (version, path)
    if best is None:
        sys.exit(
            "make test-newest-jax needs a Python >= 3.12 (pip install jax gives users on it "
            "the newest JAX) and found none on PATH, under pyenv or in /usr/bin. Install one "
            "(e.g. `pyenv install 3.12`, or your distribution's python3.12 and python3.12-venv "
            "packages), or point NEWEST_PYTHON at it."
        )
    return best[1]


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main() -> None:
    python = find_python()
    venv = os.environ.get("NEWEST_VENV", ".venv-newest-jax")
    venv_python = os.path.join(venv, "bin", "python")
    wanted = version_of(python)
    if version_of(venv_python) != wanted:  # none yet, or made by another Python
        shutil.rmtree(venv, ignore_errors=True)
        run(python, "-m", "venv", venv)
    print(f"newest-jax venv: {venv} (Python {'.'.join(map(str, wanted or ()))})", file=sys.stderr)
    run(venv_python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    # --upgrade: a venv kept from an earlier run must move to a newer JAX when one exists.
    run(
        venv_python, "-m", "pip", "install", "--quiet", "--upgrade", "-e", ".[dev]", "jax", "jaxlib"
    )
    installed = run(
        venv_python, "-c", "import importlib.metadata as m; print(m.version('jax'))"
    ).strip()
    listing = run(venv_python, "-m", "pip", "index", "versions", "jax")
    match = re.search(r"Available versions:\s*([^,\s]+)", listing)
    if match is None:
        sys.exit(f"could not read the newest JAX from `pip index versions jax`:\n{listing}")
    newest = match.group(1)
    if installed != newest:
        sys.exit(
            f"the newest-JAX venv has jax {installed}, but the registry offers {newest} for "
            f"this Python: the job must test the newest release (delete {venv} and rerun)."
        )
    print(f"jax {installed} is the newest release for this Python", file=sys.stderr)
    print(venv_python)


if __name__ == "__main__":
    main()
