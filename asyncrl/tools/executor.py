"""Runs the tool calls of a turn: validation, parallelism, deadlines, output caps, per-tool limits.

Every outcome is a `ToolResult`, never an exception: an unknown tool, arguments that do not fit the
schema, a tool that raises, one that outlives its deadline (cancelled for real: the awaiting task is
cancelled, and the sandbox kills its process group) and one whose output is too long.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping, Sequence

from asyncrl.tools.base import Tool, ToolResult, ToolStatus
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
        return tuple(await asyncio.gather(*(self.call(c) for c in calls)))

    async def call(self, call: ToolCall) -> ToolResult:
        start = time.monotonic()
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return _result(
                call,
                ToolStatus.UNKNOWN_TOOL,
                start,
                error=f"no tool named {call.name!r}; available: {known}",
            )
        try:
            arguments = json.loads(call.arguments_json)
        except json.JSONDecodeError as e:
            return _result(call, ToolStatus.INVALID_ARGUMENTS, start, error=f"not JSON: {e.msg}")
        problem = validate_arguments(tool.schema, arguments)
        if problem is not None:
            return _result(call, ToolStatus.INVALID_ARGUMENTS, start, error=problem)
        limit = self._limits.get(call.name)
        try:
            if limit is None:
                output = await asyncio.wait_for(tool(**arguments), self.timeout_s)
            else:
                async with limit:
                    output = await asyncio.wait_for(tool(**arguments), self.timeout_s)
        except TimeoutError:
            return _result(
                call, ToolStatus.TIMEOUT, start, error=f"no result within {self.timeout_s:g} s"
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a tool's failure is an outcome of the episode, not of the run
            return _result(call, ToolStatus.ERROR, start, error=f"{type(e).__name__}: {e}")
        if len(output) > self.output_chars:
            return _result(
                call,
                ToolStatus.OUTPUT_TRUNCATED,
                start,
                output=output[: self.output_chars] + " …[truncated]",
            )
        return _result(call, ToolStatus.OK, start, output=output)


def _result(call: ToolCall, status: ToolStatus, start: float, output: str = "", error: str = ""):
    return ToolResult(
        name=call.name,
        status=status,
        output=output,
        error=error,
        seconds=time.monotonic() - start,
    )
