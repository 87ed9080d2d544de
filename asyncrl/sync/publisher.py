"""The `WeightPublisher`: hands the learner's parameters to the engine under a new policy version.

Publishing never blocks the event loop and never waits for the engine: the engine copies the
parameters onto its own devices and swaps them in between two decode steps. Versions increase by
one per publish; the publisher is the only one that decides them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flax import nnx

from asyncrl.checkpoint import faults
from asyncrl.sampling.protocol import RolloutEngine


@dataclass(slots=True)
class PublishRecord:
    version: int
    learner_step: int
    seconds: float


@dataclass(slots=True)
class WeightPublisher:
    engine: RolloutEngine
    version: int = 0
    history: list[PublishRecord] = field(default_factory=list)

    def publish(self, params: nnx.State, learner_step: int) -> int:
        start = time.perf_counter()
        self.version += 1
        self.engine.publish(params, self.version)
        faults.point(faults.Phase.PUBLISH, learner_step)  # handed over, not yet swapped in
        self.history.append(PublishRecord(self.version, learner_step, time.perf_counter() - start))
        return self.version
