"""The `RolloutEngine` seam: tokens in, tokens + log-probs + policy versions out.

Implementations: the in-process continuous-batching `Engine` and the remote client
(`serving/client.py`, replicas in other processes). Agents, the orchestrator, the training loop and
the trace's counter sampler depend on this protocol only: everything they use is declared here.
"""

from __future__ import annotations

from typing import Protocol

from asyncrl.sampling.stats import EngineStats
from asyncrl.types import Completion, GenerateRequest


class EngineClosed(RuntimeError):
    """The engine was closed; pending and new requests fail with this."""


class PromptTooLong(ValueError):
    """A prompt leaves no room in the context window for a single new token."""


class RolloutEngine(Protocol):
    stats: EngineStats  # counters of the engine's own work (tokens generated, steps)

    async def generate(self, request: GenerateRequest) -> Completion: ...

    def warmup(self) -> None:
        """Compile (or otherwise prepare) everything serving needs; idempotent."""
        ...

    @property
    def exhausted(self) -> bool:
        """True when no request can ever be served again (closed, or no replica left)."""
        ...

    @property
    def slots_in_use(self) -> int:
        """Requests being served right now."""
        ...

    def publish(self, params: object, version: int) -> None:
        """New weights, effective between two decode steps; tokens after it carry `version`."""
        ...

    @property
    def version(self) -> int: ...

    def close(self) -> None: ...
