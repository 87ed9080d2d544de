"""Tools made from plain Python callables: functions (sync or async) and stateful objects.

Sync functions run on a `ToolThreads` pool (`tools/threads.py`), never on asyncio's default
executor, so they neither block the event loop nor compete with anything else's threads. Python
cannot kill a thread: on timeout the executor stops waiting and the episode goes on, while a sync
function that hangs keeps its (abandoned, counted, replaced) thread. Anything that can hang belongs
in an async function or in the subprocess sandbox (`tools/python_sandbox.py`), which are cancelled
for real.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable

from asyncrl.tools import threads
from asyncrl.tools.schema import function_schema

DEFAULT_WORKERS = (
    8  # pool size for a tool built without one (tests, scripts); runs: env.tool_workers
)


class FunctionTool:
    def __init__(
        self,
        fn: Callable[..., object],
        name: str | None = None,
        *,
        pool: threads.ToolThreads | None = None,
    ) -> None:
        self._fn = fn
        self._name = name or fn.__name__
        self._pool = pool
        self._is_async = inspect.iscoroutinefunction(fn)
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
        if self._is_async:
            result = await self._fn(**arguments)
        else:
            pool = self._pool or threads.shared(DEFAULT_WORKERS)
            result = await pool.run(self._fn, **arguments)
        return result if isinstance(result, str) else json.dumps(result)


def tool(fn: Callable[..., object] | None = None, *, name: str | None = None):
    """Decorator: `@tool` or `@tool(name="calc")` turns a typed, documented function into a Tool."""
    if fn is None:
        return lambda f: FunctionTool(f, name)
    return FunctionTool(fn, name)
