"""Episodes, the orchestrator and the group queue. Knows nothing of the learner."""
