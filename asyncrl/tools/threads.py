"""`ToolThreads`: the bounded pool that runs sync tools, apart from asyncio's default executor.

Python cannot kill a thread. When the caller stops waiting for a call that is still running (its
deadline passed, or the episode was cancelled), the call's thread is *abandoned*: counted, left to
finish on its own, its result thrown away; a replacement thread takes its place in the pool, so a
hung tool costs healthy tools nothing. Replacements are bounded: at most `spare` abandoned threads
are replaced, beyond that a hung call keeps its worker until it returns (the pool shrinks instead
of growing without end). So at most `workers + spare` threads ever exist, and at most `workers`
calls run at once. Threads are daemons: an abandoned thread never blocks the process's exit. A
call not yet started when its caller gives up is skipped. The pool is safe to share between event
loops; `shared(workers)` gives the process-wide pool of a given size.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class _State(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SKIPPED = "skipped"  # its caller gave up before it started
    ABANDONED = "abandoned"  # its caller gave up while it ran
    DONE = "done"


@dataclass(slots=True)
class _Job:
    fn: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    state: _State = _State.QUEUED


@dataclass(frozen=True, slots=True)
class ThreadStats:
    workers: int
    threads: int  # alive now, abandoned ones included
    abandoned_now: int  # threads still running a call nobody waits for
    abandoned_total: int
    skipped_total: int


class ToolThreads:
    def __init__(self, workers: int, spare: int | None = None, name: str = "tool") -> None:
        if workers < 1:
            raise ValueError(f"ToolThreads needs at least one worker, got {workers}")
        self.workers = workers
        self.spare = workers if spare is None else spare
        self._name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._abandoned = 0
        self._abandoned_total = 0
        self._skipped_total = 0

    async def run(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        """`fn(**kwargs)` on a pool thread (in the caller's context variables)."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        job = _Job(lambda: context.run(fn, **kwargs), loop, loop.create_future())
        with self._lock:
            self._grow()
        self._jobs.put(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            self._give_up(job)
            raise

    def stats(self) -> ThreadStats:
        with self._lock:
            return ThreadStats(
                self.workers,
                self._threads,
                self._abandoned,
                self._abandoned_total,
                self._skipped_total,
            )

    def _target(self) -> int:
        """Threads the pool should have: its workers plus a replacement per abandoned thread,
        up to `spare` (lock held)."""
        return self.workers + min(self._abandoned, self.spare)

    def _grow(self) -> None:
        """Start threads up to the target (lock held)."""
        while self._threads < self._target():
            self._threads += 1
            n = self._threads
            threading.Thread(target=self._work, name=f"{self._name}-{n}", daemon=True).start()

    def _give_up(self, job: _Job) -> None:
        with self._lock:
            if job.state == _State.QUEUED:
                job.state = _State.SKIPPED
                self._skipped_total += 1
            elif job.state == _State.RUNNING:
                job.state = _State.ABANDONED
                self._abandoned += 1
                self._abandoned_total += 1
                self._grow()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            with self._lock:
                if job.state == _State.SKIPPED:
                    continue
                job.state = _State.RUNNING
            try:
                outcome: tuple[Any, BaseException | None] = (job.fn(), None)
            except BaseException as e:  # the tool's failure: handed to its caller
                outcome = (None, e)
            with self._lock:
                abandoned = job.state == _State.ABANDONED
                job.state = _State.DONE
                if abandoned:
                    self._abandoned -= 1
                    if self._threads > self._target():
                        self._threads -= 1  # a replacement took this thread's place
                        return
            if not abandoned:
                _settle(job, *outcome)


def _settle(job: _Job, result: Any, error: BaseException | None) -> None:
    def settle() -> None:
        if job.future.done():  # the caller was cancelled meanwhile
            return
        if error is None:
            job.future.set_result(result)
        else:
            job.future.set_exception(error)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody to tell
        job.loop.call_soon_threadsafe(settle)


_SHARED: dict[int, ToolThreads] = {}
_SHARED_LOCK = threading.Lock()


def shared(workers: int) -> ToolThreads:
    """The process-wide pool with `workers` workers (one per size: every episode of a run that
    uses `env.tool_workers` shares it, as the per-tool semaphores are shared)."""
    with _SHARED_LOCK:
        pool = _SHARED.get(workers)
        if pool is None:
            pool = _SHARED[workers] = ToolThreads(workers)
        return pool


def shared_stats() -> ThreadStats:
    """Every process-wide pool added up (what an operator watches: hung threads now and ever)."""
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
    stats = [p.stats() for p in pools]
    return ThreadStats(
        sum(s.workers for s in stats),
        sum(s.threads for s in stats),
        sum(s.abandoned_now for s in stats),
        sum(s.abandoned_total for s in stats),
        sum(s.skipped_total for s in stats),
    )
