"""Hard deadlines for code we do not control: tools and environments (their coroutines).

`within(coro, timeout_s)` awaits a coroutine for at most `timeout_s`, then cancels it. Cancelled
code gets `GRACE_S` to wind down; code that ignores the cancellation (catches CancelledError and
goes on awaiting) is then dropped: its coroutine is closed where it is suspended, and the drop is
counted in `DROPPED`. So the caller resumes at most `timeout_s + GRACE_S` after it started
(`GRACE_S` after it was itself cancelled), whatever the awaited code does, and no task is left
behind for the event loop's shutdown to wait on. Code that blocks the event loop itself (a sync
sleep inside `async def`) cannot be preempted by anything in-process; sync work belongs in
`tools/threads.py`, and untrusted programs in the sandbox.

A tool or environment that raises SystemExit gets it re-raised as `Escaped` (an ordinary
exception): inside an asyncio task SystemExit would stop the whole event loop, i.e. the run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

# Seconds that cancelled code may take to wind down (awaits in its finally blocks, a subprocess
# kill and reap) before it is dropped. A dropped coroutine still runs its `finally` code up to
# its first await, so the grace only needs to cover real waiting; short against any deadline.
GRACE_S = 0.5

# What was dropped for ignoring cancellation, by the caller's label (process-wide, for operators
# and the chaos benchmark; dropped work holds nothing afterwards, so the count is all that is left).
DROPPED: collections.Counter[str] = collections.Counter()


class Escaped(RuntimeError):
    """The awaited code raised SystemExit; it ends like any other exception of that code."""


class _Driven:
    """Drives a coroutine step by step, like `await coro`, but can stop doing so: once `forced`,
    the next cancellation thrown in closes the coroutine instead of handing it the error."""

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self.coro = coro
        self.forced = False

    def __await__(self) -> Generator[Any, Any, T]:
        coro, value, error = self.coro, None, None
        while True:
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            except SystemExit as e:
                raise Escaped(f"SystemExit({e.code!r:.200})") from None
            value, error = None, None
            try:
                value = yield yielded
            except asyncio.CancelledError as e:
                if self.forced:
                    _close(coro)
                    raise
                error = e
            except GeneratorExit:  # this driver is being closed: so is the coroutine
                _close(coro)
                raise
            except BaseException as e:  # thrown in by the task: the coroutine's to handle
                error = e


def _close(coro: Coroutine[Any, Any, Any]) -> None:
    # A coroutine that awaits again in its `finally` makes close() raise RuntimeError; it is
    # finished either way, and nothing of it is scheduled any more.
    with contextlib.suppress(Exception):
        coro.close()


async def _drive(driven: _Driven) -> Any:
    return await driven


def _consume(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a dropped task's error is not "never retrieved"


async def within(
    coro: Coroutine[Any, Any, T],
    timeout_s: float | None,
    *,
    label: str,
    grace_s: float = GRACE_S,
) -> T:
    """`await coro`, but TimeoutError after `timeout_s` seconds (None: no deadline); cancelling
    the caller cancels the coroutine too. Either way the coroutine is stopped (dropped, counted
    under `label`, if it ignores the cancellation for `grace_s`) before this returns. Code that
    itself awaits `within` calls needs a longer grace than theirs (they wind down first)."""
    driven = _Driven(coro)
    task = asyncio.ensure_future(_drive(driven))
    task.add_done_callback(_consume)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        await _stop(task, driven, label, grace_s)
        raise
    if task in done:
        return task.result()
    await _stop(task, driven, label, grace_s)
    raise TimeoutError(f"{label}: no result within {timeout_s:g} s")


async def _stop(task: asyncio.Task, driven: _Driven, label: str, grace_s: float) -> None:
    """Cancel, wait `grace_s`, then drop. Completes even when the caller is cancelled again."""
    task.cancel()
    try:
        await asyncio.wait({task}, timeout=grace_s)
    finally:
        if not task.done():
            driven.forced = True
            task.cancel()  # the coroutine is closed at its next resumption: this loop iteration
            DROPPED[label] += 1
