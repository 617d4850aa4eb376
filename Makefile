# Two commands on a fresh machine with only python3, pip and make:
#   make demo   installs into .venv if needed and runs the main job
#   make test   installs into .venv if needed and runs the tests
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kerneltune-installed

DOCS_STAMP := $(VENV)/.kerneltune-docs-installed

.PHONY: demo test test-slow test-oldest-jax test-newest-jax docs lint typecheck clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m kerneltune demo

# The suite without the tests marked slow (the longest, 7 s or more each on a 2-core CPU: the
# benchmarks' smoke runs, jobs of several processes, the Mosaic interpreter's larger
# grids), which `make test-slow` runs; CI runs both, and the newest-JAX suite runs all.
test: $(STAMP)
	$(VENV)/bin/ruff check kerneltune tests benchmarks examples tools
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal -m slow

# The oldest JAX pyproject.toml allows, in a venv of its own: the tests that exercise
# JAX's APIs most (every bundled kernel under every transform, selection, offline and
# whole-function tuning, recording, sharding, the private-API shims).
OLDEST_VENV ?= .venv-oldest-jax
OLDEST_JAX := $(shell sed -n 's/.*"jax>=\([0-9.]*\)".*/\1/p' pyproject.toml)
OLDEST_STAMP := $(OLDEST_VENV)/.kerneltune-installed-$(OLDEST_JAX)
OLDEST_JAX_TESTS := tests/kernels/test_conformance.py tests/kernels/test_backend_round_trip.py \
	tests/selection/test_chain.py tests/workflows/test_offline.py \
	tests/workflows/test_tune_function.py tests/kernel/test_recording.py \
	tests/kernel/test_sharding.py tests/test_layers.py tests/tuning/test_warm_start.py \
	tests/test_import_side_effects.py tests/tuning/test_tuner.py

$(OLDEST_STAMP): pyproject.toml
	test -x $(OLDEST_VENV)/bin/python || python3 -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install --quiet -e ".[dev]" "jax==$(OLDEST_JAX)" "jaxlib==$(OLDEST_JAX)"
	touch $(OLDEST_STAMP)

test-oldest-jax: $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/python -c "import jax; assert jax.__version__ == '$(OLDEST_JAX)', jax.__version__"
	$(OLDEST_VENV)/bin/python -m pytest -q -p no:cacheprovider $(OLDEST_JAX_TESTS)

# The newest JAX, which `pip install jax` gives users on Python >= 3.12, in a venv of its
# own made with the newest such Python found here (NEWEST_PYTHON= overrides): the whole
# suite. tools/newest_jax_venv.py fails when there is no such Python, or when the JAX it
# installed is not the newest release the registry offers.
NEWEST_VENV ?= .venv-newest-jax

# Two workers, as `make test`, after it (.ci/run): one worker left a core idle.
test-newest-jax:
	NEWEST_VENV=$(NEWEST_VENV) python3 tools/newest_jax_venv.py
	$(NEWEST_VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,docs]"
	touch $(DOCS_STAMP)

# The documentation site, built offline into site/; --strict turns a broken link, a
# missing reference or a docstring that does not parse into an error.
docs: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(VENV)/bin/ruff check kerneltune tests benchmarks examples tools
	$(VENV)/bin/ruff format --check kerneltune tests benchmarks examples tools

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(NEWEST_VENV) .pytest_cache .ruff_cache .mypy_cache site
