"""The kernel model: `Kernel` and `Invocation`, its methods for a platform (found once),
the callable that runs it with a config, its hooks as selection calls them, recording
and sharding. It imports `core` and `tuning`."""
