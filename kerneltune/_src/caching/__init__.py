"""Where configs are kept: the memory cache and overlays, the persistent cache and its
entries, sharing, exported results and manifests, the shipped tables and the tuned
neighbours a warm start begins from. It imports `core`, `tuning` and `kernel`."""
