"""Tests of `kerneltune/_src/tuning`: the tuner, validation, search, timers, warm start,
multi-process agreement."""
