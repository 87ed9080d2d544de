"""Advantages, losses and batching (pure); the jitted steps; the `Learner` that runs them."""
