"""What a stage can install around the training loop: periodic work and phase points.

Periodic work (held-out evaluation, checkpoints, the progress line) runs after each optimizer step
as `after_step` hooks. Phase points are called at the moments where a crash is most damaging —
while a step's groups are half collected, with a train step dispatched but not finished, with a
version handed to the engine but not yet swapped in, and with a checkpoint being written — so a
recovery test can inject a kill there. Both default to nothing: the loop below the stages never
reads the environment or knows what a hook does.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl.learner.loop import TrainingLoop


class Phase(enum.StrEnum):
    ROLLOUT = "rollout"
    TRAIN = "train"
    CHECKPOINT = "checkpoint"
    PUBLISH = "publish"


AfterStep = Callable[[int, "TrainingLoop"], Awaitable[None]]
PhasePoint = Callable[[Phase, int], None]


def _nowhere(phase: Phase, step: int) -> None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopHooks:
    after_step: tuple[AfterStep, ...] = ()
    at_phase: PhasePoint = _nowhere
