"""Tools made from plain Python callables: functions (sync or async) and stateful objects.

Sync functions run in a worker thread so they never block the event loop. Python cannot kill a
thread: on timeout the executor stops waiting and the episode goes on, but a sync function that
hangs keeps its thread. Anything that can hang belongs in an async function or in the subprocess
sandbox (`tools/python_sandbox.py`), which are cancelled for real.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable

from asyncrl.tools.schema import function_schema


class FunctionTool:
    def __init__(self, fn: Callable[..., object], name: str | None = None) -> None:
        self._fn = fn
        self._name = name or fn.__name__
        self._description, self._schema = function_schema(fn)

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str:
        return self._description

    @property
    def schema(self) -> dict[str, object]:
        return self._schema

    async def __call__(self, **arguments: object) -> str:
        if inspect.iscoroutinefunction(self._fn):
            result = await self._fn(**arguments)
        else:
            result = await asyncio.to_thread(self._fn, **arguments)
        return result if isinstance(result, str) else json.dumps(result)


def tool(fn: Callable[..., object] | None = None, *, name: str | None = None):
    """Decorator: `@tool` or `@tool(name="calc")` turns a typed, documented function into a Tool."""
    if fn is None:
        return lambda f: FunctionTool(f, name)
    return FunctionTool(fn, name)
