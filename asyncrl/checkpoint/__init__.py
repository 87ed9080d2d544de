"""Checkpoints that restore the pipeline: Orbax for arrays, JSON for the pipeline state."""
