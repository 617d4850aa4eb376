"""kerneltune's tests, one folder per layer of `kerneltune/_src/` (`core/`, `caching/`,
`selection/`, `tuning/`, `execution/`, `kernel/`, `workflows/`, `cli/`), `kernels/` for
the bundled kernels and `docs/` for the README, docs, examples and benchmarks; tests of
the package as a whole sit here. `helpers` holds the shared kernels, the deterministic
cost timer and the numeric helpers; `offline_kernels` and `worker_kernels` hold kernels
that worker processes import by name (`--import tests.worker_kernels`)."""
