"""asyncrl: asynchronous agentic-RL post-training for language models on JAX.

The package is laid out as in DESIGN.md; `asyncrl.config` and `asyncrl.types` import no JAX, so the
CLI and the KFP components can validate a run configuration without starting an accelerator runtime.
"""

__version__ = "0.1.0"
