"""Hard deadlines for code we do not control: tools and environments (their coroutines).

`within(coro, timeout_s)` awaits a coroutine for at most `timeout_s`, then cancels it. Cancelled
code gets `GRACE_S` to wind down; code that ignores the cancellation (catches CancelledError and
goes on awaiting) is then dropped: its coroutine is closed where it is suspended, and the drop is
counted in `DROPPED`. So the caller resumes at most `timeout_s + GRACE_S` after it started
(`GRACE_S` after it was itself cancelled), whatever the awaited code does, and nothing is left
behind for the event loop's shutdown to wait on. Code that blocks the event loop itself (a sync
sleep inside `async def`) cannot be preempted by anything in-process; sync work belongs in
`tools/threads.py`, and untrusted programs in the sandbox.

The coroutine runs in the caller's own task (no task, no `asyncio.wait` per call: this is on every
episode, close and tool call), stepped by a driver that can stop forwarding to it. The deadline
and the grace are timers that cancel the caller's task; each cancellation it makes is taken back
(`Task.uncancel`) before `within` returns, so callers' own `asyncio.timeout`s and cancellations
count as before. A cancellation reaching the driver starts the grace only when it is meant for
this call: its own deadline, or the caller cancelled from outside; not the deadline of a `within`
nested inside it. Because the coroutine shares the caller's task, context variables it sets are
the caller's too (a tool that sets one changes it for the rest of its episode).

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


# The `within` calls active in each task, outermost first (they nest strictly within one task).
_ACTIVE: dict[asyncio.Task, list[_Driven]] = {}


class _Driven:
    """Drives a coroutine step by step in the caller's task, like `await coro`, but can stop doing
    so: once `forced`, the next cancellation thrown in closes the coroutine instead of handing it
    the error. Owns the call's timers and the cancellations they made."""

    __slots__ = (
        "active",
        "baseline",
        "cancels",
        "coro",
        "deadline_at",
        "expired",
        "forced",
        "grace",
        "grace_s",
        "label",
        "task",
        "timer",
    )

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        task: asyncio.Task,
        label: str,
        grace_s: float,
        deadline_at: float | None,
    ) -> None:
        self.coro, self.task, self.label, self.grace_s = coro, task, label, grace_s
        # Loop time of the deadline; its timer is armed at the first suspension (code that
        # finishes without suspending, like most closes, never needs one).
        self.deadline_at = deadline_at
        self.timer: asyncio.TimerHandle | None = None
        self.baseline = task.cancelling()  # cancellations requested before the call
        self.expired = False  # the deadline passed
        self.forced = False  # the grace passed too: drop the coroutine
        self.cancels = 0  # this call's own cancellations of the task, not yet taken back
        self.grace: asyncio.TimerHandle | None = None
        self.active = True

    def expire(self) -> None:
        if self.active:
            self.expired = True
            self._cancel()

    def force(self) -> None:
        if self.active:
            self.forced = True
            DROPPED[self.label] += 1
            self._cancel()  # the coroutine is closed at the task's next step: this loop iteration

    def _cancel(self) -> None:
        self.cancels += 1
        self.task.cancel()

    def _meant_for_this_call(self) -> bool:
        """A cancellation arriving now is this call's deadline or the caller's cancellation, not
        only the deadline of a call nested inside this one."""
        if self.expired:
            return True
        stack = _ACTIVE.get(self.task, ())
        inner = sum(d.cancels for d in stack[stack.index(self) + 1 :]) if self in stack else 0
        return self.task.cancelling() > self.baseline + self.cancels + inner

    def settle(self) -> None:
        """Stop the timers and take back this call's own cancellations (idempotent)."""
        self.active = False
        if self.timer is not None:
            self.timer.cancel()
        if self.grace is not None:
            self.grace.cancel()
        for _ in range(self.cancels):
            self.task.uncancel()
        self.cancels = 0

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value, error = self.coro, None, None
        while True:
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            except SystemExit as e:
                raise Escaped(f"SystemExit({e.code!r:.200})") from None
            value, error = None, None
            if self.timer is None and self.deadline_at is not None:
                self.timer = self.task.get_loop().call_at(self.deadline_at, self.expire)
            try:
                value = yield yielded
            except asyncio.CancelledError as e:
                if self.forced:
                    _close(coro)
                    raise
                if self.grace is None and self._meant_for_this_call():
                    self.grace = self.task.get_loop().call_later(self.grace_s, self.force)
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


def _leave(driven: _Driven) -> None:
    """Settle this call and any nested one left behind (a dropped coroutine's)."""
    stack = _ACTIVE.get(driven.task)
    if stack and stack[-1] is driven and not driven.cancels and driven.grace is None:
        stack.pop()  # the usual way out: innermost, no grace or cancellation of its own left
        if not stack:
            del _ACTIVE[driven.task]
        driven.active = False
        if driven.timer is not None:
            driven.timer.cancel()
        return
    if stack is not None and driven in stack:
        at = stack.index(driven)
        for d in stack[at:]:
            d.settle()
        del stack[at:]
        if not stack:
            del _ACTIVE[driven.task]
    driven.settle()


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
    task = asyncio.current_task()
    if task is None:
        coro.close()
        raise RuntimeError("within() must be awaited inside an asyncio task")
    deadline_at = None if timeout_s is None else task.get_loop().time() + timeout_s
    driven = _Driven(coro, task, label, grace_s, deadline_at)
    _ACTIVE.setdefault(task, []).append(driven)
    error: BaseException | None = None
    try:
        result = await driven
    except (Exception, asyncio.CancelledError) as e:
        error = e
    finally:
        _leave(driven)
    if task.cancelling() > driven.baseline:  # the caller was cancelled meanwhile: so is the call
        raise error if isinstance(error, asyncio.CancelledError) else asyncio.CancelledError()
    if driven.expired:  # whatever the coroutine did after its cancellation
        raise TimeoutError(f"{label}: no result within {timeout_s:g} s") from None
    if error is not None:
        raise error
    return result
