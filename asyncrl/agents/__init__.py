"""Agents: turn an episode's messages into the prompt tokens and the model's tokens into actions.

An agent owns the episode's `Conversation` (tokens, loss mask, log-probs, versions): sampled tokens
are appended exactly as the engine returned them, everything else with mask 0. `ToolAgent` parses
tool calls in the chat format's syntax; `ModelAgent` takes the first response as the answer.

Whatever the model writes, `record` returns an `Action`: a call over the limits of
`tokenize/call_json.py` (size, nesting, number length; the parser checks them itself) or one the
parser cannot read is a `MALFORMED` action with the reason, which the environment shows to the
model or ends the episode on (`env.malformed_tool_call`), never an exception that would end it as
an environment failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from asyncrl.envs.base import Action, ActionKind
from asyncrl.tokenize.chat import ChatFormat, Conversation
from asyncrl.tokenize.tool_calls import parse_turn
from asyncrl.types import Completion, Message


class Agent(Protocol):
    conversation: Conversation

    def start(self, messages: Sequence[Message]) -> None: ...

    def prompt(self) -> tuple[int, ...]:
        """Open an assistant turn; the whole sequence so far is the prompt."""
        ...

    def record(self, completion: Completion) -> Action:
        """Append the sampled tokens and say what they mean."""
        ...

    def observe(self, messages: Sequence[Message]) -> None: ...


class ToolAgent:
    def __init__(self, fmt: ChatFormat) -> None:
        self.fmt = fmt
        self.conversation = Conversation(fmt)

    def start(self, messages: Sequence[Message]) -> None:
        self.conversation = Conversation.of(self.fmt, messages)

    def prompt(self) -> tuple[int, ...]:
        self.conversation.begin_assistant()
        return tuple(self.conversation.tokens)

    def record(self, completion: Completion) -> Action:
        self.conversation.add_sampled(completion.tokens, completion.logprobs, completion.versions)
        parsed = parse_turn(self.fmt, completion.tokens)
        if parsed.error is not None:
            return Action(kind=ActionKind.MALFORMED, content=parsed.content, error=parsed.error)
        if parsed.tool_calls:
            return Action(
                kind=ActionKind.TOOL_CALLS, content=parsed.content, tool_calls=parsed.tool_calls
            )
        return Action(kind=ActionKind.ANSWER, content=parsed.content)

    def observe(self, messages: Sequence[Message]) -> None:
        for message in messages:
            self.conversation.add(message)


class ModelAgent(ToolAgent):
    """One response is the answer: tool-call syntax is not interpreted."""

    def record(self, completion: Completion) -> Action:
        self.conversation.add_sampled(completion.tokens, completion.logprobs, completion.versions)
        body = [t for t in completion.tokens if t not in self.fmt.stop_tokens]
        return Action(kind=ActionKind.ANSWER, content=self.fmt.tok.decode(body).strip())
