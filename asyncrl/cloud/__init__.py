"""Running on GKE: TPU node pools, the rollout/trainer JobSet, multi-host JAX."""
