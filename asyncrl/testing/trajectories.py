"""Trajectories for tests, self-tests and benchmarks: a fixed one (the same tokens every time, all
but the first token in the loss) and seeded random groups."""

from __future__ import annotations

import numpy as np

from asyncrl.types import Group, Trajectory


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


def random_groups(
    n_groups: int, size: int, lengths: tuple[int, int], prompt: int, seed: int = 0
) -> list[Group]:
    """`n_groups` groups of `size` random trajectories of `lengths` [low, high) tokens, the first
    `prompt` outside the loss, behaviour log-probs in [-6, -1); rewards 1 for every third member
    (offset by the group), so every group of two or more carries signal."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        members = []
        for i in range(size):
            length = int(rng.integers(*lengths))
            mask = (0,) * prompt + (1,) * (length - prompt)
            members.append(
                Trajectory(
                    id=f"{g}-{i}",
                    group_id=f"g{g}",
                    task_id="t",
                    tokens=tuple(int(x) for x in rng.integers(0, 250, length)),
                    loss_mask=mask,
                    logprobs=tuple(float(-rng.uniform(1, 6)) if m else 0.0 for m in mask),
                    versions=tuple(0 if m else -1 for m in mask),
                    reward=float((i + g) % 3 == 0),
                )
            )
        groups.append(Group(group_id=f"g{g}", number=g, task_id="t", trajectories=tuple(members)))
    return groups
