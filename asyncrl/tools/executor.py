"""Runs the tool calls of a turn: validation, parallelism, deadlines, output caps, per-tool limits.

Every outcome is a `ToolResult`, never an exception: an unknown tool, arguments that are not JSON,
break the call limits (`tokenize/call_json.py`) or do not fit the schema, a tool that raises, one
that returns something other than text, one that outlives its deadline (cancelled for real: the
tool is cancelled, and the sandbox kills its process group; one that ignores the cancellation is
dropped after `deadlines.GRACE_S`, see `deadlines.py`) and one whose output is too long. Output and
error text are both cut to `output_chars`: a tool's exception message is model input like its
output.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence

from asyncrl.tokenize.call_json import CallError, load_call_json
from asyncrl.tools.base import Tool, ToolResult, ToolStatus
from asyncrl.tools.deadlines import within
from asyncrl.tools.schema import validate_arguments
from asyncrl.types import ToolCall


class ToolExecutor:
    def __init__(
        self,
        tools: Iterable[Tool],
        *,
        timeout_s: float,
        output_chars: int,
        limits: Mapping[str, asyncio.Semaphore] | None = None,
    ) -> None:
        self.tools = {t.name: t for t in tools}
        self.timeout_s = timeout_s
        self.output_chars = output_chars
        # Per-tool concurrency limits (name -> semaphore), shared by every episode's executor:
        # a slow judge or sandbox pool must not take every episode.
        self._limits = dict(limits or {})

    def describe(self) -> list[dict[str, object]]:
        """The tool list as shown to a model (OpenAI/Qwen function-calling layout)."""
        return [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.schema},
            }
            for t in self.tools.values()
        ]

    async def call_all(self, calls: Sequence[ToolCall]) -> tuple[ToolResult, ...]:
        """All calls of one turn, concurrently; results in call order."""
        if len(calls) == 1:  # the common turn: no task per call (gather would make one)
            return (await self.call(calls[0]),)
        return tuple(await asyncio.gather(*(self.call(c) for c in calls)))

    async def call(self, call: ToolCall) -> ToolResult:
        start = time.monotonic()
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            error = f"no tool named {call.name!r}; available: {known}"
            return self._result(call, ToolStatus.UNKNOWN_TOOL, start, error=error)
        try:
            arguments = load_call_json(call.arguments_json)
        except CallError as e:
            return self._result(call, ToolStatus.INVALID_ARGUMENTS, start, error=str(e))
        try:
            problem = validate_arguments(tool.schema, arguments)
        except Exception as e:  # the tool's own schema is broken: the tool fails, not the run
            return self._result(call, ToolStatus.ERROR, start, error=f"bad schema: {_describe(e)}")
        if problem is not None:
            return self._result(call, ToolStatus.INVALID_ARGUMENTS, start, error=problem)
        limit = self._limits.get(call.name)
        try:
            if limit is None:
                output = await self._run(tool, arguments)
            else:
                async with limit:
                    output = await self._run(tool, arguments)
        except TimeoutError:
            error = f"no result within {self.timeout_s:g} s"
            return self._result(call, ToolStatus.TIMEOUT, start, error=error)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a tool's failure is an outcome of the episode, not of the run
            return self._result(call, ToolStatus.ERROR, start, error=_describe(e))
        if not isinstance(output, str):
            error = f"the tool returned {type(output).__name__}, not text"
            return self._result(call, ToolStatus.ERROR, start, error=error)
        if len(output) > self.output_chars:
            output = _cut(output, self.output_chars)
            return self._result(call, ToolStatus.OUTPUT_TRUNCATED, start, output=output)
        return self._result(call, ToolStatus.OK, start, output=output)

    async def _run(self, tool: Tool, arguments: object) -> object:
        return await within(tool(**arguments), self.timeout_s, label=f"tool {tool.name}")

    def _result(
        self, call: ToolCall, status: ToolStatus, start: float, output: str = "", error: str = ""
    ) -> ToolResult:
        return ToolResult(
            name=call.name,
            status=status,
            output=output,
            error=_cut(error, self.output_chars),
            seconds=time.monotonic() - start,
        )


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + " …[truncated]"


def _describe(error: BaseException) -> str:
    """`Type: message`; a message that cannot be rendered (its __str__ raises) is named as such."""
    try:
        message = str(error)
    except Exception:
        message = "<the error's message could not be rendered>"
    return f"{type(error).__name__}: {message}"
