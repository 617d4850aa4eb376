"""kerneltune's implementation, one package per layer, bottom to top: `core`, `tuning`,
`kernel`, `caching`, `selection`, `execution`, `workflows`, `cli` (the bundled kernels,
`kerneltune.kernels`, sit between `workflows` and `cli`). A module imports only from its
own layer and the layers below it (`tests/test_layers.py`, `docs/architecture.md`).

Two modules stay beside the packages: `version` (the version, read by the build) and
`params` (the attention configs, whose qualified names cache entries and the shipped
tables store). The public API is `kerneltune`.
"""
