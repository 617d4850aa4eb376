"""kerneltune's implementation, one concept per module; the public API is `kerneltune`."""
