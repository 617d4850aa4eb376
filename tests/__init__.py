"""kerneltune's tests. `helpers` holds the shared kernels and the deterministic cost
timer; `offline_kernels` and `worker_kernels` hold kernels that worker processes import
by name (`--import tests.worker_kernels`)."""
