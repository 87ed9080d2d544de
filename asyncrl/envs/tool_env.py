"""`ToolEnvironment` (tools until a final answer) and `TaskEnvironment` (one answer, no tools).

Outcomes, each with its status: a final answer ends the episode as completed with the reward; a
tool that outlives its deadline ends it as timeout, one that fails otherwise (raises, returns no
text) as tool_error; a malformed call, an unknown tool or bad arguments become an error message
the model sees ("observation") or end the episode as invalid_action ("terminate"), as configured.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from asyncrl.config.rollout import MalformedToolCall
from asyncrl.envs.base import Action, ActionKind, StepResult
from asyncrl.rewards import reward_parts
from asyncrl.tools.base import ToolStatus
from asyncrl.tools.executor import ToolExecutor
from asyncrl.types import Message, Role, Task, TrajectoryStatus


def _answer(task: Task, action: Action) -> StepResult:
    parts = reward_parts(task, action.content)
    reward = dict(parts)["exact_match"]  # the rewarded part, computed once
    return StepResult(done=True, reward=reward, reward_parts=parts)


def _invalid() -> StepResult:
    return StepResult(done=True, status=TrajectoryStatus.INVALID_ACTION)


class ToolEnvironment:
    def __init__(
        self,
        make_executor: Callable[[Task], ToolExecutor],
        *,
        malformed: MalformedToolCall = "observation",
        describe_tools: bool = False,
    ) -> None:
        self._make_executor = make_executor
        self._malformed = malformed
        self._describe = describe_tools
        self.task: Task | None = None
        self.executor: ToolExecutor | None = None
        self.closed = False

    async def reset(self, task: Task) -> tuple[Message, ...]:
        self.task = task
        self.executor = self._make_executor(task)
        user = Message(role=Role.USER, content=task.prompt)
        if not self._describe:
            return (user,)
        tools = "\n".join(json.dumps(t) for t in self.executor.describe())
        system = (
            "You may call one or more functions to assist with the user query.\n"
            f"<tools>\n{tools}\n</tools>\n"
            'For each call, return {"name": ..., "arguments": ...} inside <tool_call></tool_call>.'
        )
        return (Message(role=Role.SYSTEM, content=system), user)

    async def step(self, action: Action) -> StepResult:
        assert self.task is not None and self.executor is not None, "step before reset"
        if action.kind == ActionKind.ANSWER:
            return _answer(self.task, action)
        if action.kind == ActionKind.MALFORMED:
            if self._malformed == "terminate":
                return _invalid()
            error = Message(role=Role.TOOL, name="error", content=f"error: {action.error}")
            return StepResult(done=False, messages=(error,))
        results = await self.executor.call_all(action.tool_calls)
        if any(r.status == ToolStatus.TIMEOUT for r in results):
            return StepResult(done=True, status=TrajectoryStatus.TIMEOUT, tool_results=results)
        if any(r.status.tool_failure for r in results):
            return StepResult(done=True, status=TrajectoryStatus.TOOL_ERROR, tool_results=results)
        if self._malformed == "terminate" and any(r.status.model_error for r in results):
            return StepResult(
                done=True, status=TrajectoryStatus.INVALID_ACTION, tool_results=results
            )
        messages = tuple(
            Message(role=Role.TOOL, name=r.name, content=r.observation()) for r in results
        )
        return StepResult(done=False, messages=messages, tool_results=results)

    async def close(self) -> None:
        self.closed = True


class TaskEnvironment:
    """Single turn: the first response is the answer; a tool call is an invalid action."""

    def __init__(self) -> None:
        self.task: Task | None = None
        self.closed = False

    async def reset(self, task: Task) -> tuple[Message, ...]:
        self.task = task
        return (Message(role=Role.USER, content=task.prompt),)

    async def step(self, action: Action) -> StepResult:
        assert self.task is not None, "step before reset"
        if action.kind == ActionKind.ANSWER:
            return _answer(self.task, action)
        return _invalid()

    async def close(self) -> None:
        self.closed = True
