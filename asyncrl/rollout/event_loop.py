"""The event loop a rollout process runs its episodes on: uvloop when installed, else asyncio's.

uvloop keeps its timers, handles and ready queue in C; asyncio's are Python objects (a timer heap
compared by a Python `__lt__`, a Python `_run_once`). The straggler workload wakes the loop a
few times per episode for every model call and tool sleep, so that machinery is a fixed share of
each episode. Measured on `benchmarks/straggler.py` (2 shared cores, load ~5, paired runs): the
workload's sleeps alone cost ~20% less loop CPU on uvloop, the orchestrated workload ~6% less per
episode. Behaviour is asyncio's: tasks are still `asyncio.Task`s (cancel, uncancel and cancelling
as `tools/deadlines.py` uses them), only the loop under them differs.

uvloop comes with orbax-checkpoint (a dependency), so it is there wherever asyncrl is installed;
without it (another platform) `run` falls back to asyncio's loop. Nothing here runs at import.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # not installed: asyncio's own loop
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on `new_event_loop()`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
