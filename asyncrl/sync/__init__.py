"""Weight publication from the learner to the rollout engine, and policy versions."""
