"""Environments by name, so a task (a data set row) says which environment runs it.

`build_environment(task, cfg)` looks up `task.environment`; projects register their own with
`register("name", factory)`. Built-ins: "tool" (calculator + lookup over the task's table),
"python" (calculator + the sandboxed python tool) and "task" (single turn, no tools). Sync tools
run on the process-wide pool of `env.tool_workers` threads (`tools/threads.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from asyncrl.config.rollout import EnvConfig
from asyncrl.envs.base import Environment
from asyncrl.envs.tool_env import TaskEnvironment, ToolEnvironment
from asyncrl.tools.calculator import calculator
from asyncrl.tools.executor import ToolExecutor
from asyncrl.tools.function import FunctionTool
from asyncrl.tools.lookup import LookupTool
from asyncrl.tools.python_sandbox import PythonSandbox
from asyncrl.tools.threads import shared
from asyncrl.types import Task

# (task, env config, shared per-tool semaphores) -> a fresh environment for one episode
EnvFactory = Callable[[Task, EnvConfig, Mapping[str, asyncio.Semaphore]], Environment]
_REGISTRY: dict[str, EnvFactory] = {}


def register(name: str, make: EnvFactory) -> None:
    _REGISTRY[name] = make


def factory(name: str) -> EnvFactory:
    """The factory registered under `name` (to wrap it: latency, chaos); KeyError if none."""
    return _REGISTRY[name]


def build_environment(
    task: Task, cfg: EnvConfig, limits: Mapping[str, asyncio.Semaphore] | None = None
) -> Environment:
    try:
        make = _REGISTRY[task.environment]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(
            f"task {task.id} names environment {task.environment!r}; registered: {known}"
        ) from None
    return make(task, cfg, limits or {})


def _tool_env(task: Task, cfg: EnvConfig, limits) -> Environment:
    def executor(t: Task) -> ToolExecutor:
        tools = (FunctionTool(calculator, pool=shared(cfg.tool_workers)), LookupTool(dict(t.table)))
        return ToolExecutor(
            tools, timeout_s=cfg.tool_timeout_s, output_chars=cfg.tool_output_chars, limits=limits
        )

    return ToolEnvironment(executor, malformed=cfg.malformed_tool_call)


def _python_env(task: Task, cfg: EnvConfig, limits) -> Environment:
    def executor(t: Task) -> ToolExecutor:
        tools = (FunctionTool(calculator, pool=shared(cfg.tool_workers)), PythonSandbox())
        return ToolExecutor(
            tools, timeout_s=cfg.tool_timeout_s, output_chars=cfg.tool_output_chars, limits=limits
        )

    return ToolEnvironment(executor, malformed=cfg.malformed_tool_call)


register("tool", _tool_env)
register("python", _python_env)
register("task", lambda task, cfg, limits: TaskEnvironment())
