"""Chat formats: messages and tool calls rendered into tokens, with the mask of model-produced ones.

A `Conversation` only ever appends: each message is rendered on its own and concatenated, so a new
turn never re-tokenizes an earlier one, and the tokens the model sampled are appended exactly as
sampled. `mask[i]` is 1 when the model produced `tokens[i]` (an assistant's content, tool calls and
end-of-turn token), 0 for everything the format or the outside world added.

Two formats: `chatml` (Qwen2/2.5: <|im_start|>role ... <|im_end|>, tool calls in
<tool_call>{json}</tool_call>, results in <tool_response>) and `llama3` (header tokens, <|eot_id|>,
tool calls as {"name", "parameters"} JSON, results under the `ipython` role).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from asyncrl.config.model import ChatFormatName
from asyncrl.tokenize.base import Tokenizer
from asyncrl.types import Message, Role, ToolCall


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of tokens that share one mask value."""

    tokens: tuple[int, ...]
    produced: bool


class ChatFormat:
    """Renders messages for one template; see the module docstring for the two templates."""

    def __init__(self, name: ChatFormatName, tokenizer: Tokenizer) -> None:
        self.name = name
        self.tok = tokenizer
        sp = tokenizer.special_id
        if name == "chatml":
            self.end_of_turn = sp("<|im_end|>")
            self.call_open, self.call_close = sp("<tool_call>"), sp("</tool_call>")
        else:
            self.end_of_turn = sp("<|eot_id|>")
            self.call_open = self.call_close = -1
        self.stop_tokens: tuple[int, ...] = (self.end_of_turn,)
        # Fixed pieces, rendered once: every turn of every episode uses them.
        self._headers = {role: self._header(role) for role in Role}
        self._after_turn = tuple(self.tok.encode("\n")) if name == "chatml" else ()

    # -- rendering pieces -------------------------------------------------------------------------
    def header(self, role: Role) -> tuple[int, ...]:
        """Tokens that open a turn of `role` (not model-produced)."""
        return self._headers[role]

    def _header(self, role: Role) -> tuple[int, ...]:
        if self.name == "chatml":
            shown = "user" if role == Role.TOOL else role.value
            return (self.tok.special_id("<|im_start|>"), *self.tok.encode(f"{shown}\n"))
        shown = "ipython" if role == Role.TOOL else role.value
        return (
            self.tok.special_id("<|start_header_id|>"),
            *self.tok.encode(shown),
            self.tok.special_id("<|end_header_id|>"),
            *self.tok.encode("\n\n"),
        )

    def after_turn(self) -> tuple[int, ...]:
        """Tokens the template puts after an end-of-turn token (not model-produced)."""
        return self._after_turn

    def start(self) -> tuple[int, ...]:
        """Tokens that open a conversation."""
        return (self.tok.special_id("<|begin_of_text|>"),) if self.name == "llama3" else ()

    def tool_call_tokens(self, call: ToolCall) -> tuple[int, ...]:
        args = json.loads(call.arguments_json)
        if self.name == "chatml":
            body = json.dumps({"name": call.name, "arguments": args})
            return (self.call_open, *self.tok.encode(f"\n{body}\n"), self.call_close)
        return tuple(self.tok.encode(json.dumps({"name": call.name, "parameters": args})))

    def body(self, message: Message) -> tuple[int, ...]:
        """The content of a turn, tool calls included, without header or end-of-turn."""
        if message.role == Role.TOOL and self.name == "chatml":
            return (
                self.tok.special_id("<tool_response>"),
                *self.tok.encode(f"\n{message.content}\n"),
                self.tok.special_id("</tool_response>"),
            )
        tokens = list(self.tok.encode(message.content))
        for i, call in enumerate(message.tool_calls):
            if tokens or i:
                tokens += self.tok.encode("\n")
            tokens += self.tool_call_tokens(call)
        return tuple(tokens)

    def segments(self, message: Message) -> list[Segment]:
        """One message as segments: header (0), body + end-of-turn (1 if assistant), suffix (0)."""
        produced = message.role == Role.ASSISTANT
        return [
            Segment(self.header(message.role), False),
            Segment((*self.body(message), self.end_of_turn), produced),
            Segment(self.after_turn(), False),
        ]


@dataclass(slots=True)
class Conversation:
    """An append-only token sequence with its loss mask, and for sampled tokens the log-prob and
    policy version the engine reported (0.0 and -1 for every other token)."""

    fmt: ChatFormat
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, fmt: ChatFormat, messages: Iterable[Message] = ()) -> Conversation:
        conv = cls(fmt)
        conv.append_tokens(fmt.start(), produced=False)
        for m in messages:
            conv.add(m)
        return conv

    def append_tokens(
        self,
        tokens: Sequence[int],
        *,
        produced: bool,
        logprobs: Sequence[float] | None = None,
        versions: Sequence[int] | None = None,
    ) -> None:
        n = len(tokens)
        self.tokens.extend(tokens)
        self.mask.extend((1,) * n if produced else (0,) * n)
        self.logprobs.extend(logprobs if logprobs is not None else (0.0,) * n)
        self.versions.extend(versions if versions is not None else (-1,) * n)

    def add(self, message: Message) -> None:
        """Append a whole rendered message (an assistant message counts as model-produced)."""
        segments = self.fmt.segments(message)
        if not any(seg.produced for seg in segments):  # one mask run: one append
            tokens = tuple(itertools.chain.from_iterable(seg.tokens for seg in segments))
            self.append_tokens(tokens, produced=False)
            return
        for seg in segments:
            self.append_tokens(seg.tokens, produced=seg.produced)

    def begin_assistant(self) -> None:
        """Append the assistant header: what the model is prompted with before it samples."""
        self.append_tokens(self.fmt.header(Role.ASSISTANT), produced=False)

    def add_sampled(
        self,
        tokens: Sequence[int],
        logprobs: Sequence[float] | None = None,
        versions: Sequence[int] | None = None,
    ) -> None:
        """Append the model's sampled tokens verbatim and close the turn.

        If sampling stopped without an end-of-turn token (length limit), the format's end token is
        appended as a non-produced token so the next turn starts from a well-formed sequence.
        """
        self.append_tokens(tokens, produced=True, logprobs=logprobs, versions=versions)
        tail = self.fmt.after_turn()
        if not tokens or tokens[-1] not in self.fmt.stop_tokens:
            tail = (self.fmt.end_of_turn, *tail)
        self.append_tokens(tail, produced=False)


def render(fmt: ChatFormat, messages: Iterable[Message], *, generation_prompt: bool = False):
    """Tokens and mask of `messages`; with `generation_prompt`, ends on an open assistant turn."""
    conv = Conversation.of(fmt, messages)
    if generation_prompt:
        conv.begin_assistant()
    return conv.tokens, conv.mask
