"""Group-relative advantages (GRPO): each member's reward against its own group's mean.

A = r - mean(group r), optionally divided by a standard deviation: the group's ("group"), the
whole batch's ("batch", as Dr. GRPO and others recommend against per-group scaling's bias toward
easy and hard prompts), or not at all ("none"). A group whose rewards are all equal has zero
advantages and contributes no gradient. Pure NumPy, no model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from asyncrl.config.learner import AdvantageScaling

EPS = 1e-6


def group_advantages(
    rewards: Sequence[Sequence[float]], scaling: AdvantageScaling = "group"
) -> list[np.ndarray]:
    """Advantages for a list of groups of rewards (groups may differ in size)."""
    groups = [np.asarray(g, np.float64) for g in rewards]
    centred = [g - g.mean() for g in groups]
    if scaling == "group":
        return [
            (c / (g.std() + EPS)).astype(np.float32) for g, c in zip(groups, centred, strict=True)
        ]
    if scaling == "batch":
        spread = np.concatenate(centred).std() if centred else 0.0
        return [(c / (spread + EPS)).astype(np.float32) for c in centred]
    return [c.astype(np.float32) for c in centred]


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ at all: equal rewards give every member advantage 0."""
    return len(rewards) > 1 and max(rewards) != min(rewards)
