"""Fixed trajectories for tests and self-tests: the same tokens every time, all but the first
token in the loss."""

from __future__ import annotations

from asyncrl.types import Trajectory


def fixed_trajectory(length: int = 37, first: int = 3) -> Trajectory:
    tokens = tuple(range(first, first + length))
    return Trajectory(
        id="t",
        group_id="g",
        task_id="x",
        tokens=tokens,
        loss_mask=(0,) + (1,) * (length - 1),
        logprobs=(0.0,) * length,
        versions=(0,) * length,
        reward=1.0,
    )
