"""A scripted `RolloutEngine` for orchestration tests: replies come from a function of the request.

It stands in for the model, not for the engine under test: tests of the engine use the real one.
Each reply may be delayed (asyncio.sleep), and every token gets log-prob -1 and the current version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from asyncrl.sampling.stats import EngineStats
from asyncrl.types import Completion, FinishReason, GenerateRequest

Reply = tuple[Sequence[int], FinishReason]


class ScriptedEngine:
    def __init__(self, script: Callable[[GenerateRequest], Reply], delay_s: float = 0.0) -> None:
        self.script = script
        self.delay_s = delay_s
        self.requests: list[GenerateRequest] = []
        self._version = 0
        self._closed = False
        self.stats = EngineStats()
        self.slots_in_use = 0

    @property
    def version(self) -> int:
        return self._version

    @property
    def exhausted(self) -> bool:
        return self._closed

    def warmup(self) -> None:
        return None

    def publish(self, params: object, version: int) -> None:
        self._version = version

    async def generate(self, request: GenerateRequest) -> Completion:
        self.requests.append(request)
        self.slots_in_use += 1
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        finally:
            self.slots_in_use -= 1
        tokens, reason = self.script(request)
        tokens = tuple(tokens)[: request.params.max_tokens]
        if len(tokens) == request.params.max_tokens and reason == FinishReason.STOP:
            reason = (
                FinishReason.STOP
                if tokens and tokens[-1] in request.params.stop_tokens
                else FinishReason.LENGTH
            )
        self.stats.generated_tokens += len(tokens)
        return Completion(
            tokens=tokens,
            logprobs=(-1.0,) * len(tokens),
            raw_logprobs=(-1.0,) * len(tokens),
            versions=(self._version,) * len(tokens),
            finish_reason=reason,
            prompt_tokens=len(request.prompt),
        )

    def close(self) -> None:
        self._closed = True
