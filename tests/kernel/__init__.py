"""Tests of `kerneltune/_src/kernel`: dispatch, methods, custom VJPs, recording,
sharding."""
