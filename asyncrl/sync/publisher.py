"""The `WeightPublisher`: hands the learner's parameters to the engine under a given policy version.

Publishing never blocks the event loop and never waits for the engine: the engine copies the
parameters onto its own devices and swaps them in between two decode steps. The training loop's
state decides the version (one more per publish); the publisher only delivers it and times it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from flax import nnx

from asyncrl.sampling.protocol import RolloutEngine


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishRecord:
    version: int
    learner_step: int
    seconds: float


@dataclass(frozen=True, slots=True)
class WeightPublisher:
    engine: RolloutEngine

    def publish(self, params: nnx.State, version: int, learner_step: int) -> PublishRecord:
        start = time.perf_counter()
        self.engine.publish(params, version)
        return PublishRecord(
            version=version, learner_step=learner_step, seconds=time.perf_counter() - start
        )
