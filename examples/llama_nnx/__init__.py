"""A Llama-style block in Flax NNX: RMSNorm, grouped-query attention, SwiGLU."""
