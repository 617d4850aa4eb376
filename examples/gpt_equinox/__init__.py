"""A GPT-style block in Equinox: pre-LayerNorm, multi-head attention, GELU MLP."""
