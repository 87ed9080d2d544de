"""Limits on a tool call's JSON, checked on the text before anything parses it.

A model writes tool calls; nothing bounds what it writes except these limits. Past them Python's
own JSON reader fails in ways that are not JSON errors (RecursionError at ~1000 levels of nesting,
ValueError beyond 4300 digits of an integer) or takes quadratic time, so the text is checked first
and a violation is reported as one sentence for the model to read, exactly like a syntax error.
The turn parser (`tool_calls.py`) checks each call's text, and the tool executor a call's
arguments, through `load_call_json`: every reader of model-written JSON is behind the limits.

The check is exact: one linear pass without recursion that knows strings from structure. It runs
only when a cheaper test over the whole text (string contents included, so it can only
over-report) finds more brackets than `MAX_DEPTH` or a run of number characters longer than
`MAX_NUMBER_CHARS`; ordinary calls never need it.
"""

from __future__ import annotations

import json
import re

MAX_CALL_CHARS = 16_384  # one call's JSON text
MAX_DEPTH = 32  # nested arrays and objects
MAX_NUMBER_CHARS = 100  # one number literal (a float64 needs at most ~25)

_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LONG_RUN = re.compile(f"[0-9+\\-.eE]{{{MAX_NUMBER_CHARS + 1}}}")


class CallError(ValueError):
    """The call's text is not JSON, or breaks a limit; the message is for the model."""


def check_call_text(text: str) -> str | None:
    """None when `text` is within the limits, else what is wrong (JSON syntax is not checked)."""
    if len(text) > MAX_CALL_CHARS:
        return f"tool call is {len(text)} characters long; the limit is {MAX_CALL_CHARS}"
    if text.count("[") + text.count("{") <= MAX_DEPTH and _LONG_RUN.search(text) is None:
        return None
    return _scan(text)


def _scan(text: str) -> str | None:
    depth = number = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch in _NUMBER_CHARS:
            number += 1
            if number > MAX_NUMBER_CHARS:
                return f"tool call has a number longer than {MAX_NUMBER_CHARS} characters"
            continue
        number = 0
        if ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return f"tool call nests deeper than {MAX_DEPTH} levels"
        elif ch in "]}":
            depth -= 1
    return None


def load_call_json(text: str) -> object:
    """The parsed JSON of a call; raises CallError (never anything else) when it cannot be read."""
    problem = check_call_text(text)
    if problem is not None:
        raise CallError(problem)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CallError(f"not JSON: {e.msg} at character {e.pos}") from None
    except (ValueError, RecursionError) as e:  # the check bounds both; kept as a last line
        raise CallError(f"not JSON: unreadable ({type(e).__name__})") from None
