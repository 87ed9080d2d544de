"""Expert demonstrations of the built-in task families, as trajectories for the SFT warm start.

With `tool_fraction` < 1 only that share of tasks (a fixed draw per task) gets the expert's
demonstration; the others get an unaided teacher's immediate guess, which is usually wrong. A
model warm-started on such mixed-quality data uses the tools only some of the time: the gap that
agentic RL closes (reward comes from the tools' exact results). With `verbose_fraction` > 0 that
share of the tool-using demonstrations adds a remark after the answer ("391 (according to the
tools)") rather than ending at the bare number the tasks' exact-match verifier accepts: a verbose
teacher, whose habit the warm-started model picks up and RL has to trade for answers that earn
reward. With `privileged_fraction` > 0 that share of the tool-using demonstrations comes from a
teacher that sees the environment's hidden state (a lookup task's price table): it looks up the
first item only and writes the second item's price, which it already knows, into the calculator
call. Every such demonstration is correct; the student, which cannot see the table, can only
reproduce it by inventing that price: the imitation gap between a privileged expert and its
student, which reward (not more imitation) closes.

A demonstration is the conversation a correct agent would have: its tool calls, the tools' real
outputs (the same tools the environment runs), and the final answer, rendered by the chat format
with the loss mask on the assistant's tokens. Nothing is re-tokenized later: the trajectory's
tokens are what SFT trains on.

`content_only=True` keeps in the mask only the tokens that carry the episode's content (tool
argument values and the final answer) and drops the fixed syntax around them. The warm start trains
on these first: a small model that learns the boilerplate first stays stuck at chance on the
content (measured: fixed-offset digit copying is learned in ~100 steps from content tokens alone,
and not within 400 when the surrounding JSON is trained from the start).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from asyncrl.rewards import exact_match
from asyncrl.tokenize.chat import ChatFormat, Conversation
from asyncrl.tools.calculator import evaluate
from asyncrl.types import Message, Role, Task, ToolCall, Trajectory


def _call(name: str, **arguments: str) -> ToolCall:
    return ToolCall(name=name, arguments_json=json.dumps(arguments))


def remark(answer: str) -> str:
    """A verbose teacher's final answer: right, but not in the bare form the tasks ask for."""
    return f"{answer} (according to the tools)"


def with_remark(messages: list[Message]) -> list[Message]:
    """The same episode, its final answer followed by the verbose teacher's remark."""
    return [*messages[:-1], Message(role=Role.ASSISTANT, content=remark(messages[-1].content))]


def expert_messages(task: Task, verbose: bool = False) -> list[Message]:
    """The messages of a correct episode for a built-in task (`verbose`: answer with a remark)."""
    messages = _expert_messages(task)
    return with_remark(messages) if verbose else messages


def privileged_messages(task: Task) -> list[Message]:
    """A correct episode by a teacher that sees the hidden state (a lookup task's price table): it
    looks up the first item only and writes the second price, which it knows, into the calculator
    call. Tasks without hidden state get the expert's episode."""
    if task.family != "lookup":
        return _expert_messages(task)
    return _lookup_messages(task, look_up=1)


def _lookup_messages(task: Task, look_up: int) -> list[Message]:
    """A lookup task solved by looking up its first `look_up` items (in one turn) and writing the
    prices of the rest, known to the teacher, straight into the calculator call."""
    items = task.prompt.removesuffix("=?").split("+")
    prices = dict(task.table)
    expression = "+".join(prices[item] for item in items)
    result = evaluate(expression)
    looked = items[:look_up]
    return [
        Message(role=Role.USER, content=task.prompt),
        Message(role=Role.ASSISTANT, tool_calls=tuple(_call("lookup", key=i) for i in looked)),
        *(Message(role=Role.TOOL, name="lookup", content=prices[i]) for i in looked),
        Message(role=Role.ASSISTANT, tool_calls=(_call("calculator", expression=expression),)),
        Message(role=Role.TOOL, name="calculator", content=result),
        Message(role=Role.ASSISTANT, content=result),
    ]


def _expert_messages(task: Task) -> list[Message]:
    if task.family == "calculator":
        expression = task.prompt.removesuffix("=?")
        result = evaluate(expression)
        return [
            Message(role=Role.USER, content=task.prompt),
            Message(role=Role.ASSISTANT, tool_calls=(_call("calculator", expression=expression),)),
            Message(role=Role.TOOL, name="calculator", content=result),
            Message(role=Role.ASSISTANT, content=result),
        ]
    if task.family == "lookup":
        return _lookup_messages(task, look_up=2)
    raise ValueError(f"no expert for task family {task.family!r}")


def guess(task: Task) -> str:
    """An unaided teacher's answer: the calculation done roughly, or a typical sum of prices."""
    if task.family == "calculator":
        a, op, b = re.match(r"(\d+)([*+])(\d+)", task.prompt).groups()
        rough = round(int(b), -1)
        return str(int(a) * rough if op == "*" else int(a) + rough)
    return "100"


def direct_messages(task: Task) -> list[Message]:
    """The messages of an episode that answers at once, without tools (usually wrong)."""
    return [
        Message(role=Role.USER, content=task.prompt),
        Message(role=Role.ASSISTANT, content=guess(task)),
    ]


def _draw(kind: str, task: Task) -> float:
    """A fixed uniform draw in [0, 1) per (kind, task id)."""
    digest = hashlib.sha256(f"{kind}/{task.id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def uses_tools(task: Task, tool_fraction: float) -> bool:
    """Whether the demonstration of `task` uses the tools: a fixed draw per task id."""
    return _draw("tools", task) < tool_fraction


def is_privileged(task: Task, privileged_fraction: float) -> bool:
    """Whether the demonstration of `task` comes from the privileged teacher: a fixed draw."""
    return _draw("privileged", task) < privileged_fraction


def is_verbose(task: Task, verbose_fraction: float) -> bool:
    """Whether the demonstration of `task` remarks on its answer: a fixed draw per task id."""
    return _draw("verbose", task) < verbose_fraction


def content_values(message: Message) -> list[str]:
    """The strings of an assistant message that carry content: argument values and the answer."""
    values = [message.content] if message.content else []
    for call in message.tool_calls:
        values += [str(v) for v in call.arguments().values()]
    return values


def _content_mask(conv: Conversation, messages: list[Message]) -> list[int]:
    """1 on produced tokens whose text overlaps a content value of their assistant turn."""
    fmt = conv.fmt
    mask = [0] * len(conv.tokens)
    assistants = iter(m for m in messages if m.role == Role.ASSISTANT)
    i = 0
    while i < len(conv.tokens):
        if not conv.mask[i]:
            i += 1
            continue
        j = i
        while j < len(conv.tokens) and conv.mask[j]:
            j += 1
        pieces = [fmt.tok.decode([t]) for t in conv.tokens[i:j]]
        text, starts = "".join(pieces), [0]
        for p in pieces:
            starts.append(starts[-1] + len(p))
        for value in content_values(next(assistants)):
            at = text.find(value)
            if value and at >= 0:
                for k in range(j - i):
                    if starts[k] < at + len(value) and starts[k + 1] > at:
                        mask[i + k] = 1
        i = j
    return mask


def demonstration(
    task: Task,
    fmt: ChatFormat,
    content_only: bool = False,
    tool_fraction: float = 1.0,
    verbose_fraction: float = 0.0,
    privileged_fraction: float = 0.0,
) -> Trajectory:
    expert = uses_tools(task, tool_fraction)
    if not expert:
        plain = direct_messages(task)
    elif is_privileged(task, privileged_fraction):
        plain = privileged_messages(task)
    else:
        plain = expert_messages(task)
    messages = with_remark(plain) if expert and is_verbose(task, verbose_fraction) else plain
    conv = Conversation.of(fmt, messages)
    # A remark is style, not content: the content mask keeps only the answer's value.
    mask = _content_mask(conv, plain) if content_only else conv.mask
    return Trajectory(
        id=f"demo/{task.id}",
        group_id=f"demo/{task.id}",
        task_id=task.id,
        tokens=tuple(conv.tokens),
        loss_mask=tuple(mask),
        logprobs=tuple(conv.logprobs),
        versions=tuple(conv.versions),
        reward=float(exact_match(task, messages[-1].content)),
        turns=sum(m.role == Role.ASSISTANT for m in messages),
    )


def demonstrations(
    tasks: Iterable[Task],
    fmt: ChatFormat,
    content_only: bool = False,
    tool_fraction: float = 1.0,
    verbose_fraction: float = 0.0,
    privileged_fraction: float = 0.0,
) -> list[Trajectory]:
    mix = (tool_fraction, verbose_fraction, privileged_fraction)
    return [demonstration(t, fmt, content_only, *mix) for t in tasks]
