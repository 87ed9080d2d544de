"""The `RolloutEngine` seam: tokens in, tokens + log-probs + policy versions out.

Implementations: the in-process continuous-batching `Engine` and `remote.RemoteEngine` (replicas in
other processes). Agents and
the orchestrator depend on this protocol only.
"""

from __future__ import annotations

from typing import Protocol

from asyncrl.types import Completion, GenerateRequest


class EngineClosed(RuntimeError):
    """The engine was closed; pending and new requests fail with this."""


class PromptTooLong(ValueError):
    """A prompt leaves no room in the context window for a single new token."""


class RolloutEngine(Protocol):
    async def generate(self, request: GenerateRequest) -> Completion: ...

    def publish(self, params: object, version: int) -> None:
        """New weights, effective between two decode steps; tokens after it carry `version`."""
        ...

    @property
    def version(self) -> int: ...

    def close(self) -> None: ...
