"""Tool calls parsed from the tokens a model sampled, in its chat format's syntax.

Parsing works on tokens, not on re-tokenized text: in ChatML the call tags are special tokens, so
only the model can open a call. A malformed call is reported as a `ParsedTurn` with an `error`,
never raised: the agent decides whether the model sees the error or the episode ends. Each call's
text is decoded once and read behind the limits of `call_json.py` (size, nesting, number length),
so whatever the model wrote, parsing returns; the first problem in the turn is the one reported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from asyncrl.tokenize.call_json import check_call_text
from asyncrl.tokenize.chat import ChatFormat
from asyncrl.types import ToolCall


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedTurn:
    content: str  # the turn's text outside tool calls
    tool_calls: tuple[ToolCall, ...] = ()
    error: str | None = None  # why the turn's tool-call syntax is malformed


def _call_from_json(text: str, args_key: str) -> ToolCall | str:
    problem = check_call_text(text)
    if problem is not None:
        return problem
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"tool call is not valid JSON ({e.msg} at character {e.pos})"
    except (ValueError, RecursionError) as e:  # bounded by the check above; a last line
        return f"tool call could not be read ({type(e).__name__})"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return 'tool call must be a JSON object with a string "name"'
    args = value.get(args_key, {})
    if not isinstance(args, dict):
        return f'tool call "{args_key}" must be a JSON object'
    return ToolCall(name=value["name"], arguments_json=json.dumps(args))


def parse_turn(fmt: ChatFormat, tokens: Sequence[int]) -> ParsedTurn:
    """Split a sampled turn into text and tool calls (end-of-turn tokens are ignored)."""
    body = _without_stops(fmt, tokens)
    if fmt.name == "llama3":
        return _parse_llama3(fmt.tok.decode(body))
    content: list[str] = []
    calls: list[ToolCall] = []
    i = 0
    while i < len(body):
        j = _next_tag(fmt, body, i)
        if j > i:  # text up to the next tag (or the end)
            content.append(fmt.tok.decode(body[i:j]))
            i = j
            continue
        if body[i] == fmt.call_close:
            return ParsedTurn(content=_join(content), error="</tool_call> without <tool_call>")
        try:
            end = body.index(fmt.call_close, i + 1)
        except ValueError:
            return ParsedTurn(content=_join(content), error="<tool_call> is never closed")
        call = _call_from_json(fmt.tok.decode(body[i + 1 : end]).strip(), "arguments")
        if isinstance(call, str):
            return ParsedTurn(content=_join(content), error=call)
        calls.append(call)
        i = end + 1
    return ParsedTurn(content=_join(content), tool_calls=tuple(calls))


def _without_stops(fmt: ChatFormat, tokens: Sequence[int]) -> list[int]:
    """The turn without its end-of-turn tokens (usually one, last): searched in C, not per token."""
    body = list(tokens)
    stops = fmt.stop_tokens
    while body and body[-1] in stops:
        body.pop()
    if any(s in body for s in stops):
        body = [t for t in body if t not in stops]
    return body


def _next_tag(fmt: ChatFormat, body: list[int], start: int) -> int:
    """Index of the first call tag (open or close) at or after `start`, else len(body)."""
    end = len(body)
    for tag in (fmt.call_open, fmt.call_close):
        try:
            end = body.index(tag, start, end)
        except ValueError:  # none before `end`
            continue
    return end


def _join(parts: list[str]) -> str:
    return "".join(parts).strip()


def _parse_llama3(text: str) -> ParsedTurn:
    stripped = text.strip()
    if not stripped.startswith("{"):
        return ParsedTurn(content=stripped)
    calls: list[ToolCall] = []
    for line in stripped.splitlines():
        if not line.strip():
            continue
        call = _call_from_json(line.strip(), "parameters")
        if isinstance(call, str):
            return ParsedTurn(content="", error=call)
        calls.append(call)
    return ParsedTurn(content="", tool_calls=tuple(calls))
