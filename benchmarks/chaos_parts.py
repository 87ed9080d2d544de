"""The chaos benchmark's faults (`benchmarks/chaos.py` runs them and checks the invariants).

Injected tools and environments: `install_chaos` replaces the built-in "tool" environment in this
process's registry with `ChaosEnvironment`, which wraps the real one, raises or hangs (ignoring
cancellation) in its factory, `reset`, `step` and `close` at the rates of `Rates`, and on a share of
turns calls a misbehaving tool through the real `ToolExecutor` (a sync tool that sleeps past every
deadline, an async tool that swallows every cancellation, a 5 MB error, 10 MB of output). What was
injected is tallied in `TALLY`; `RNG` draws every fault (seeded by the benchmark).

Remote replicas: `RemoteChaos` sends each `GARBAGE` payload to the first replica, then kills the
last one with SIGKILL. Nothing in the product is changed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field, replace

from asyncrl.envs.base import Action, ActionKind
from asyncrl.envs.registry import factory, register
from asyncrl.envs.tool_env import ToolEnvironment
from asyncrl.tools import threads
from asyncrl.tools.executor import ToolExecutor
from asyncrl.tools.function import FunctionTool
from asyncrl.types import ToolCall

SYNC_HANG_S = 20.0  # a hung sync tool's sleep: longer than any deadline, shorter than the run


@dataclass(frozen=True)
class Rates:
    """Probabilities per call of each injected fault."""

    factory_raise: float = 0.03
    reset_raise: float = 0.04
    reset_hang: float = 0.01  # ignores cancellation: the episode times out, the turn is dropped
    step_raise: float = 0.03
    close_raise: float = 0.04
    close_hang: float = 0.02  # ignores cancellation: the close is dropped after its grace
    # A turn that reaches the environment without a real call runs a chaos tool instead (an
    # untrained model's turn usually hits max_tokens first, so such turns are few).
    tool_turn: float = 1.0
    tools: tuple[tuple[str, float], ...] = (
        ("ok", 0.3),
        ("sync_hang", 0.15),
        ("async_hang", 0.15),
        ("error_flood", 0.2),
        ("output_flood", 0.2),
    )


@dataclass
class Tally:
    injected: collections.Counter = field(default_factory=collections.Counter)
    factory_calls: int = 0
    built: list = field(default_factory=list)  # every chaos environment built


TALLY = Tally()
RNG = random.Random(0)


def _chance(p: float) -> bool:
    return RNG.random() < p


async def _swallow_cancellation() -> None:
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)


def sync_hang() -> str:
    """Sleep in the tool's thread far past the deadline."""
    time.sleep(SYNC_HANG_S)
    return "late"


async def async_hang() -> str:
    """Ignore every cancellation."""
    await _swallow_cancellation()
    return "never"


def error_flood() -> str:
    """Raise with a 5 MB message."""
    raise RuntimeError("E" * 5_000_000)


async def output_flood() -> str:
    """Return 10 MB of text."""
    return "F" * 10_000_000


def ok() -> str:
    """Answer at once."""
    return "ok"


class ChaosEnvironment:
    """The real tool environment, with faults injected around it and chaos tools beside it."""

    def __init__(self, inner, cfg, limits, rates: Rates) -> None:
        pool = threads.shared(cfg.tool_workers)
        sync = [FunctionTool(f, pool=pool) for f in (sync_hang, error_flood, ok)]
        tools = [*sync, FunctionTool(async_hang), FunctionTool(output_flood)]
        executor = ToolExecutor(
            tools, timeout_s=cfg.tool_timeout_s, output_chars=cfg.tool_output_chars, limits=limits
        )
        self.inner, self.rates = inner, rates
        self.chaos = ToolEnvironment(lambda task: executor)
        self.close_calls = 0

    def _inject(self, what: str, p: float) -> bool:
        hit = _chance(p)
        if hit:
            TALLY.injected[what] += 1
        return hit

    async def reset(self, task):
        if self._inject("reset_raise", self.rates.reset_raise):
            raise RuntimeError("chaos: reset raised")
        if self._inject("reset_hang", self.rates.reset_hang):
            await _swallow_cancellation()
        await self.chaos.reset(task)
        return await self.inner.reset(task)

    async def step(self, action: Action):
        if self._inject("step_raise", self.rates.step_raise):
            raise RuntimeError("chaos: step raised")
        if action.kind != ActionKind.TOOL_CALLS and _chance(self.rates.tool_turn):
            names, weights = zip(*self.rates.tools, strict=True)
            name = RNG.choices(names, weights)[0]
            TALLY.injected[f"tool_{name}"] += 1
            return await self.chaos.step(
                replace(action, kind=ActionKind.TOOL_CALLS, tool_calls=(ToolCall(name=name),))
            )
        return await self.inner.step(action)

    async def close(self) -> None:
        self.close_calls += 1
        if self._inject("close_raise", self.rates.close_raise):
            raise RuntimeError("chaos: close raised")
        if self._inject("close_hang", self.rates.close_hang):
            await _swallow_cancellation()
        await self.inner.close()


def install_chaos(rates: Rates) -> None:
    """Replace the "tool" environment (every training task's) in this process's registry."""
    real = factory("tool")

    def chaos_factory(task, cfg, limits):
        TALLY.factory_calls += 1
        if _chance(rates.factory_raise):
            TALLY.injected["factory_raise"] += 1
            raise RuntimeError("chaos: the environment factory raised")
        env = ChaosEnvironment(real(task, cfg, limits), cfg, limits, rates)
        TALLY.built.append(env)
        return env

    register("tool", chaos_factory)


# -- the remote replicas: garbage, then a kill ---------------------------------------------------


GARBAGE = {
    "random_bytes": lambda token: (
        bytes(random.Random(1).randrange(256) for _ in range(4096)) + b"\n"
    ),
    "oversized_line": lambda token: b"x" * 20_000_000,
    "no_token": lambda token: b'{"op": "health"}\n',
    "bad_request": lambda token: (
        json.dumps(
            {"token": token, "op": "generate", "request": {"prompt": [2**40], "params": {}}}
        ).encode()
        + b"\n"
    ),
    "deep_nesting": lambda token: b"[" * 100_000 + b"\n",
    "unknown_op": lambda token: json.dumps({"token": token, "op": "format_disk"}).encode() + b"\n",
    "silence": lambda token: b"",
}


def send_garbage(address: tuple[str, int], token: str) -> dict[str, str]:
    """Each payload on its own connection; what the replica answered (first line, or how the
    connection ended)."""
    answers = {}
    for name, payload in GARBAGE.items():
        try:
            with socket.create_connection(address, timeout=30) as s:
                with contextlib.suppress(OSError):
                    s.sendall(payload(token))
                reply = s.makefile("rb").readline(400)
            answers[name] = reply.decode("utf-8", "replace").strip()[:120] or "closed"
        except OSError as e:
            answers[name] = f"{type(e).__name__}"
    return answers


@dataclass
class RemoteChaos:
    seconds: float
    replicas: object = None
    garbage: dict = field(default_factory=dict)
    killed: str = ""
    killed_at: float = 0.0

    def install(self) -> None:
        import asyncrl.serving.replica as replica_module

        start = replica_module.start_local_replicas

        def recorded(*args, **kw):
            self.replicas = start(*args, **kw)
            threading.Thread(target=self._run, daemon=True, name="chaos-remote").start()
            return self.replicas

        replica_module.start_local_replicas = recorded

    def _run(self) -> None:
        r = self.replicas
        time.sleep(self.seconds * 0.25)
        self.garbage = send_garbage(r.addresses[0], r.token.reveal())
        time.sleep(self.seconds * 0.25)
        victim = r.processes[-1]
        host, port = r.addresses[-1]
        victim.kill()
        self.killed, self.killed_at = f"{host}:{port}", time.monotonic()
