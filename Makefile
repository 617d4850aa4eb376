# Two commands on a fresh machine with only python3, pip and make:
#   make demo   installs into .venv if needed and runs the main job
#   make test   installs into .venv if needed and runs the tests
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kerneltune-installed

DOCS_STAMP := $(VENV)/.kerneltune-docs-installed

.PHONY: demo test docs lint typecheck clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m kerneltune demo

test: $(STAMP)
	$(VENV)/bin/ruff check kerneltune tests benchmarks examples
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,docs]"
	touch $(DOCS_STAMP)

# The documentation site, built offline into site/; --strict turns a broken link, a
# missing reference or a docstring that does not parse into an error.
docs: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(VENV)/bin/ruff check kerneltune tests benchmarks examples
	$(VENV)/bin/ruff format --check kerneltune tests benchmarks examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache site
