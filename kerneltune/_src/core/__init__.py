"""The foundation: options, files, the codec, keys, configs, devices, labels, scopes,
trace detection, coordination between processes and the one door into JAX's internals.
It imports nothing from kerneltune but itself (and `params`, `version`)."""
