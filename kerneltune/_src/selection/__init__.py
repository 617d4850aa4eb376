"""Choosing a config: the policy, one object per tier, the chain that asks them in
order, and the tuning of one key on a miss. It imports every layer below: `core`,
`tuning`, `kernel` and `caching`."""
