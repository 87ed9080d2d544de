"""The `lookup` tool: a read-only key-value store, one per episode (a stateful tool).

Keys are matched case-insensitively after trimming. A missing key is an ordinary answer ("no
value stored under ...") for the model to read, not a failure of the tool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar


class LookupTool:
    name = "lookup"
    description = "Look up the value stored under a key."
    schema: ClassVar[dict[str, object]] = {
        "type": "object",
        "properties": {"key": {"type": "string", "description": "the key to look up"}},
        "required": ["key"],
        "additionalProperties": False,
    }

    def __init__(self, table: Mapping[str, str]) -> None:
        self._table = {k.strip().lower(): v for k, v in table.items()}
        self.calls = 0

    async def __call__(self, key: str) -> str:
        self.calls += 1
        value = self._table.get(key.strip().lower())
        return value if value is not None else f"no value stored under {key!r}"
