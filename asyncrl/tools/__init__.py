"""Tools: the `Tool` protocol, schemas from signatures, the executor, and the built-ins
(calculator, lookup, sandboxed python)."""
