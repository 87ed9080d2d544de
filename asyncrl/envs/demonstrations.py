"""Expert demonstrations of the built-in task families, as trajectories for the SFT warm start.

A demonstration is the conversation a correct agent would have: its tool calls, the tools' real
outputs (the same tools the environment runs), and the final answer, rendered by the chat format
with the loss mask on the assistant's tokens. Nothing is re-tokenized later: the trajectory's
tokens are what SFT trains on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from asyncrl.envs.base import Task
from asyncrl.tokenize.chat import ChatFormat, Conversation
from asyncrl.tools.calculator import evaluate
from asyncrl.types import Message, Role, ToolCall, Trajectory


def _call(name: str, **arguments: str) -> ToolCall:
    return ToolCall(name=name, arguments_json=json.dumps(arguments))


def expert_messages(task: Task) -> list[Message]:
    """The messages of a correct episode for a built-in task."""
    user = Message(role=Role.USER, content=task.prompt)
    if task.family == "calculator":
        expression = task.prompt.removesuffix("=?")
        result = evaluate(expression)
        return [
            user,
            Message(role=Role.ASSISTANT, tool_calls=(_call("calculator", expression=expression),)),
            Message(role=Role.TOOL, name="calculator", content=result),
            Message(role=Role.ASSISTANT, content=result),
        ]
    if task.family == "lookup":
        x, y = task.prompt.removesuffix("=?").split("+")
        prices = dict(task.table)
        expression = f"{prices[x]}+{prices[y]}"
        result = evaluate(expression)
        return [
            user,
            Message(
                role=Role.ASSISTANT, tool_calls=(_call("lookup", key=x), _call("lookup", key=y))
            ),
            Message(role=Role.TOOL, name="lookup", content=prices[x]),
            Message(role=Role.TOOL, name="lookup", content=prices[y]),
            Message(role=Role.ASSISTANT, tool_calls=(_call("calculator", expression=expression),)),
            Message(role=Role.TOOL, name="calculator", content=result),
            Message(role=Role.ASSISTANT, content=result),
        ]
    raise ValueError(f"no expert for task family {task.family!r}")


def demonstration(task: Task, fmt: ChatFormat) -> Trajectory:
    conv = Conversation.of(fmt, expert_messages(task))
    return Trajectory(
        id=f"demo/{task.id}",
        group_id=f"demo/{task.id}",
        task_id=task.id,
        tokens=tuple(conv.tokens),
        loss_mask=tuple(conv.mask),
        logprobs=tuple(conv.logprobs),
        versions=tuple(conv.versions),
        reward=1.0,
        turns=sum(m.role == Role.ASSISTANT for m in expert_messages(task)),
    )


def demonstrations(tasks: Iterable[Task], fmt: ChatFormat) -> list[Trajectory]:
    return [demonstration(t, fmt) for t in tasks]
