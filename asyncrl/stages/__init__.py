"""Stages: plain functions that take a `RunConfig` and paths and return a small result record.

The only package that wires concrete classes, reads environment variables, builds meshes and starts
`jax.distributed`. The CLI calls stages directly; a KFP component is a thin adapter over one.
"""
