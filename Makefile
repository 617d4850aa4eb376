# Two commands on a fresh machine with only python3, pip and make:
#   make demo   installs into .venv if needed and runs the main job
#   make test   installs into .venv if needed and runs the tests
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kerneltune-installed

.PHONY: demo test lint typecheck clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m kerneltune demo

test: $(STAMP)
	$(VENV)/bin/ruff check kerneltune tests benchmarks
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check kerneltune tests benchmarks
	$(VENV)/bin/ruff format --check kerneltune tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
