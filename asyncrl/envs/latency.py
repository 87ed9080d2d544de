"""Injected latency and failures for any tool or environment, for tests and benchmarks.

`LatencySpec` describes a distribution of delays: fixed, lognormal (given its median and 99th
percentile), or heavy-tailed (lognormal plus rare stragglers and hangs), and a failure probability.
The wrappers sleep before the real call (asyncio.sleep: cancellable, never blocking the loop) and
raise `InjectedFailure` with the given probability.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from typing import Literal

from asyncrl.envs.base import Action, Environment, StepResult
from asyncrl.tools.base import Tool
from asyncrl.types import Message, Task

Z99 = 2.3263478740408408  # standard normal 99th percentile


class InjectedFailure(RuntimeError):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencySpec:
    kind: Literal["none", "fixed", "lognormal", "heavy_tail"] = "none"
    p50_s: float = 0.05
    p99_s: float = 1.0
    straggler_prob: float = 0.0  # heavy_tail: chance of a `straggler_s` delay
    straggler_s: float = 5.0
    hang_prob: float = 0.0  # heavy_tail: chance of a delay of `hang_s` (longer than any timeout)
    hang_s: float = 3600.0
    failure_prob: float = 0.0

    def sample(self, rng: random.Random) -> float:
        if self.kind == "none":
            return 0.0
        if self.kind == "fixed":
            return self.p50_s
        sigma = math.log(self.p99_s / self.p50_s) / Z99
        delay = self.p50_s * math.exp(sigma * rng.gauss(0.0, 1.0))
        if self.kind == "heavy_tail":
            u = rng.random()
            if u < self.hang_prob:
                return self.hang_s
            if u < self.hang_prob + self.straggler_prob:
                return self.straggler_s
        return delay

    def mean_s(self) -> float:
        """Expected delay (for computing throughput bounds)."""
        if self.kind == "none":
            return 0.0
        if self.kind == "fixed":
            return self.p50_s
        sigma = math.log(self.p99_s / self.p50_s) / Z99
        base = self.p50_s * math.exp(sigma**2 / 2)
        if self.kind == "heavy_tail":
            rest = 1 - self.hang_prob - self.straggler_prob
            return (
                rest * base + self.straggler_prob * self.straggler_s + self.hang_prob * self.hang_s
            )
        return base


class DelayedTool:
    def __init__(self, tool: Tool, spec: LatencySpec, rng: random.Random) -> None:
        self._tool, self._spec, self._rng = tool, spec, rng
        self.name, self.description, self.schema = tool.name, tool.description, tool.schema

    async def __call__(self, **arguments: object) -> str:
        await asyncio.sleep(self._spec.sample(self._rng))
        if self._rng.random() < self._spec.failure_prob:
            raise InjectedFailure(f"injected failure of tool {self.name}")
        return await self._tool(**arguments)


class DelayedEnvironment:
    """Delays (and may fail) `reset` and `step` of any environment."""

    def __init__(self, env: Environment, spec: LatencySpec, rng: random.Random) -> None:
        self._env, self._spec, self._rng = env, spec, rng

    async def _delay(self, what: str) -> None:
        await asyncio.sleep(self._spec.sample(self._rng))
        if self._rng.random() < self._spec.failure_prob:
            raise InjectedFailure(f"injected failure in environment {what}")

    async def reset(self, task: Task) -> tuple[Message, ...]:
        await self._delay("reset")
        return await self._env.reset(task)

    async def step(self, action: Action) -> StepResult:
        await self._delay("step")
        return await self._env.step(action)

    async def close(self) -> None:
        await self._env.close()
