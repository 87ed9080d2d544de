"""Held-out evaluation (and, with issue 8, the gate decision): pure reductions over episodes."""
