"""The rollout engine: sampling strategies, jitted prefill/decode steps, the continuous-batching
engine and its slot bookkeeping. Knows nothing of tools."""
