"""Where configs are kept: the in-memory cache and overlays (`cache`), the persistent
cache on disk or a URL (`persistent`, over `storage`), its entries (`cache_entry`),
sharing between caches (`cache_sharing`), exported results and manifests, the tables
shipped with the package, and the tuned neighbours a warm start begins from."""
