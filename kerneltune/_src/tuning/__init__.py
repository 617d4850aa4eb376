"""The tuning engine: compiling, running, timing and choosing among the candidates of
any function, and agreeing on the winner between processes; it knows no `Kernel`.
It imports only `core`."""
