"""Release and CI tools, run from the repository root: `python -m tools.ship_tables`
writes the tables kerneltune ships; `python3 tools/newest_jax_venv.py` makes the
newest-JAX venv CI tests on."""
