"""Autotuning: timing candidates on the device and picking the best."""
