"""Two models written once against an `ops` namespace: `examples.jax_ops` (what a JAX
user has: `jax.nn`, `jnp`) or `kerneltune.kernels` (the same signatures, tuned)."""
