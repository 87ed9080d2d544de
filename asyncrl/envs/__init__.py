"""Environments: the `Environment` protocol, tool and single-turn environments, the registry,
built-in task families with held-out splits, expert demonstrations, and latency injection."""
