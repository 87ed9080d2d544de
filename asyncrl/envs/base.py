"""The `Environment` seam, the agent's `Action`, and the task a data set row describes.

An environment sees actions (text answers and tool calls), never tokens. Its step either ends the
episode (with a reward and a status) or returns messages the agent appends as non-trained tokens.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from asyncrl.tools.base import ToolResult
from asyncrl.types import Message, Task, ToolCall, TrajectoryStatus


class ActionKind(enum.StrEnum):
    ANSWER = "answer"  # a turn with no tool calls: its text is the final answer
    TOOL_CALLS = "tool_calls"
    MALFORMED = "malformed"  # the turn's tool-call syntax is broken


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    kind: ActionKind
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    error: str = ""  # what is malformed


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    done: bool
    messages: tuple[Message, ...] = ()  # shown to the model when the episode goes on
    reward: float = 0.0
    reward_parts: tuple[tuple[str, float], ...] = ()
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED
    tool_results: tuple[ToolResult, ...] = ()


class Environment(Protocol):
    async def reset(self, task: Task) -> tuple[Message, ...]:
        """The opening messages of the episode (system and user)."""
        ...

    async def step(self, action: Action) -> StepResult: ...

    async def close(self) -> None:
        """Release what the episode held; called once, also after errors and cancellation."""
        ...
