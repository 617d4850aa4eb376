"""Tests of `kerneltune/_src/caching`: the persistent cache and manifests."""
