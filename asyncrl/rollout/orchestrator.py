"""The orchestrator: keeps up to `max_concurrency` episodes running, G per task under one group id.

It starts a new group only when (1) the admission hook allows it (the learner's staleness bound:
no generation that could not be trained in time) and (2) enough episode slots are free for its
members. Finished members go to the `GroupQueue`; failed ones are re-run there when the failure
policy says "retry". One slow episode holds only its own slot. `stop()` starts no new groups and
lets running ones finish; `cancel()` cancels running episodes, which are recorded as cancelled.
The orchestrator knows nothing of the learner beyond the admission hook.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from asyncrl import tracing
from asyncrl.agents import Agent
from asyncrl.envs.base import Environment, Task
from asyncrl.rollout.cursor import DataCursor
from asyncrl.rollout.episode import Episode, EpisodeLimits, EpisodeSpec
from asyncrl.rollout.groups import GroupQueue
from asyncrl.sampling.protocol import EngineClosed, RolloutEngine
from asyncrl.tracing import flow_id
from asyncrl.types import SamplingParams, Trajectory, TrajectoryStatus

NumberedTask = tuple[int, Task, bool]  # (group number, task, replay)


class Admission(Protocol):
    async def wait(self) -> None:
        """Return when a new group may start."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class OrchestratorSettings:
    group_size: int
    max_concurrency: int
    limits: EpisodeLimits
    sampling: SamplingParams
    seed: int = 0


def member_seed(seed: int, group_id: str, member: int, attempt: int) -> int:
    """A distinct sampling seed per (run, group, member, attempt): group members never share one."""
    digest = hashlib.sha256(f"{seed}/{group_id}/{member}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class Orchestrator:
    def __init__(
        self,
        engine: RolloutEngine,
        queue: GroupQueue,
        settings: OrchestratorSettings,
        *,
        make_env: Callable[[Task], Environment],
        make_agent: Callable[[], Agent],
        admission: Admission | None = None,
        cursor: DataCursor | None = None,
    ) -> None:
        self.engine, self.queue, self.settings = engine, queue, settings
        self.make_env, self.make_agent, self.admission = make_env, make_agent, admission
        self.cursor = cursor
        self._free = asyncio.Semaphore(settings.max_concurrency)
        self._running: set[asyncio.Task] = set()
        self._stopping = False
        self.groups_started = 0
        self.retries = 0
        self.status_counts: collections.Counter[TrajectoryStatus] = collections.Counter()
        self.finished: list[Trajectory] = []  # every terminal member, kept or not (for metrics)

    @property
    def active(self) -> int:
        return len(self._running)

    async def run(self, tasks: Iterable[Task] | Iterable[NumberedTask]) -> None:
        """Start groups for `tasks` until they run out or `stop()`; wait for running episodes.

        Items are tasks (numbered in start order) or `(number, task, replay)` from a `DataCursor`:
        the number names the group, so a re-issued group keeps its id and its sampling seeds.
        """
        try:
            for item in tasks:
                if self._stopping:
                    break
                if self.admission is not None:
                    await self.admission.wait()
                if self._stopping:
                    break
                if getattr(self.engine, "exhausted", False):
                    raise EngineClosed("no rollout engine is left to serve episodes")
                if isinstance(item, tuple):
                    n, task, replay = item
                else:
                    n, task, replay = self.groups_started, item, False
                await self._start_group(n, task, replay)
            await self.drain()
        except asyncio.CancelledError:
            await self.cancel()
            raise

    async def _start_group(self, n: int, task: Task, replay: bool) -> None:
        group_id = f"{task.id}@{n}"
        self.groups_started += 1
        self.queue.open(group_id, task.id)
        if self.cursor is not None:
            self.cursor.issue(n)
        for member in range(self.settings.group_size):
            await self._free.acquire()
            if self._stopping:  # stopped while waiting for a slot: start nothing more
                self._free.release()
                return
            job = asyncio.create_task(self._member(task, group_id, member, replay), name=group_id)
            self._running.add(job)
            job.add_done_callback(self._running.discard)

    async def _member(self, task: Task, group_id: str, member: int, replay: bool) -> None:
        try:
            attempt = 0
            while True:
                trajectory = await self._episode(task, group_id, member, attempt, replay)
                self.status_counts[trajectory.status] += 1
                self.finished.append(trajectory)
                if not self.queue.should_retry(trajectory, attempt):
                    await self.queue.put(trajectory)
                    return
                tracer = tracing.get()  # the failed attempt's flow ends here
                tracer.instant(tracer.track("rollout"), "retry", ends=(flow_id(trajectory.id),))
                attempt += 1
                self.retries += 1
        finally:
            self._free.release()

    async def _episode(
        self, task: Task, group_id: str, member: int, attempt: int, replay: bool
    ) -> Trajectory:
        s = self.settings
        seed = member_seed(s.seed, group_id, member, attempt)
        spec = EpisodeSpec(
            episode_id=f"{group_id}/{member}" + (f"~{attempt}" if attempt else ""),
            group_id=group_id,
            task=task,
            sampling=replace(s.sampling, seed=seed),
            attempt=attempt,
            replay=replay,
        )
        episode = Episode(spec, self.engine, self.make_agent(), self.make_env(task), s.limits)
        try:
            return await episode.run()
        except asyncio.CancelledError:
            record = episode.trajectory(TrajectoryStatus.CANCELLED)
            self.status_counts[record.status] += 1
            self.finished.append(record)
            raise

    def stop(self) -> None:
        """Start no new groups; running episodes finish normally."""
        self._stopping = True

    async def drain(self) -> None:
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def cancel(self) -> None:
        """Stop, cancel every running episode (each closes its environment), and wait for them."""
        self._stopping = True
        while self._running:
            jobs = list(self._running)
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
