"""Tests of `kerneltune/_src/core`: call keys, labels, options, the JAX shims."""
