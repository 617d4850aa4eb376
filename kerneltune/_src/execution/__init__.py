"""Running a kernel: the `Executor` (prepare, key, choose, trace), one jitted program
per eager signature, and the default executor `Kernel.__call__` uses. It imports every
layer below, up to `selection`."""
