"""The `Tool` seam and the record of one call's outcome.

A tool has a name, a description and a JSON schema of its arguments, and is awaited with keyword
arguments already validated against that schema. What a call may cost (time, output) is enforced by
the executor, not by the tool.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class ToolStatus(enum.StrEnum):
    OK = "ok"
    INVALID_ARGUMENTS = "invalid_arguments"  # arguments do not match the tool's schema
    UNKNOWN_TOOL = "unknown_tool"
    TIMEOUT = "timeout"  # cancelled at the per-call deadline
    ERROR = "error"  # the tool raised, or its sandbox stopped it
    OUTPUT_TRUNCATED = "output_truncated"  # ran fine; output cut to the configured size

    @property
    def model_error(self) -> bool:
        """The model asked for something malformed (as opposed to the tool failing)."""
        return self in (ToolStatus.INVALID_ARGUMENTS, ToolStatus.UNKNOWN_TOOL)

    @property
    def tool_failure(self) -> bool:
        return self in (ToolStatus.TIMEOUT, ToolStatus.ERROR)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    name: str
    status: ToolStatus
    output: str = ""  # what the model sees
    error: str = ""  # why the call did not succeed, for logs and the model
    seconds: float = 0.0

    def observation(self) -> str:
        """The text shown to the model as the tool's response."""
        if self.status in (ToolStatus.OK, ToolStatus.OUTPUT_TRUNCATED):
            return self.output
        return f"error ({self.status.value}): {self.error}"


class Tool(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def schema(self) -> dict[str, object]:
        """JSON schema (an "object" schema) of the keyword arguments."""
        ...

    async def __call__(self, **arguments: object) -> str:
        """Run the tool; raise on failure. The executor turns either outcome into a ToolResult."""
        ...
