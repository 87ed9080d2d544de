"""Helpers for tests and benchmarks: tiny configs, and fakes of the outside world (never of our own
components)."""
