"""`GroupQueue`: trajectories in, complete GRPO groups out, each as soon as its own members finish.

A group is released only when all G members are terminal, never waiting for unrelated groups.
Failed members (timeout, tool_error, env_error, cancelled) are handled by the configured policy:
"drop" the whole group, keep it with the failure scored 0 ("zero"), or "retry" the member (the
orchestrator re-runs it under the same group id) up to `max_retries` times, then drop. A failed
member is never silently replaced by a copy of another. Released groups wait in a bounded buffer;
when it is full, `put` waits (backpressure on the producers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field

from asyncrl import tracing
from asyncrl.config.rollout import FailurePolicy
from asyncrl.tracing import flow_id
from asyncrl.types import Group, Trajectory, TrajectoryStatus

FAILED = frozenset(
    {
        TrajectoryStatus.TIMEOUT,
        TrajectoryStatus.TOOL_ERROR,
        TrajectoryStatus.ENV_ERROR,
        TrajectoryStatus.CANCELLED,
    }
)


@dataclass(slots=True)
class _Pending:
    task_id: str
    opened: float
    members: list[Trajectory] = field(default_factory=list)
    failed: bool = False


@dataclass(frozen=True, slots=True)
class QueueStats:
    ready: int  # complete groups waiting for the learner
    half_filled: int  # open groups with some but not all members
    open: int
    oldest_open_s: float  # age of the oldest incomplete group
    released: int
    dropped: int


class GroupQueue:
    def __init__(
        self,
        group_size: int,
        policy: FailurePolicy = "zero",
        max_retries: int = 2,
        max_ready: int = 16,
    ) -> None:
        self.group_size = group_size
        self.policy = policy
        self.max_retries = max_retries
        self._open: dict[str, _Pending] = {}
        self._ready: asyncio.Queue[Group] = asyncio.Queue(max_ready)
        self.released = 0
        self.dropped: list[str] = []

    def open(self, group_id: str, task_id: str) -> None:
        if group_id in self._open:
            raise ValueError(f"group {group_id} is already open")
        self._open[group_id] = _Pending(task_id=task_id, opened=time.monotonic())

    def should_retry(self, trajectory: Trajectory, attempt: int) -> bool:
        """Whether the orchestrator should re-run this member instead of `put`ting it."""
        return self.policy == "retry" and trajectory.status in FAILED and attempt < self.max_retries

    async def put(self, trajectory: Trajectory) -> Group | None:
        """Add a terminal member; returns the group if this completed it (and it was kept)."""
        pending = self._open[trajectory.group_id]
        if trajectory.status in FAILED:
            pending.failed = True
            if self.policy == "zero":
                trajectory = dataclasses.replace(trajectory, reward=0.0)
        pending.members.append(trajectory)
        if len(pending.members) < self.group_size:
            return None
        del self._open[trajectory.group_id]
        tracer = tracing.get()
        members = tuple(flow_id(t.id) for t in pending.members)
        if pending.failed and self.policy != "zero":
            self.dropped.append(trajectory.group_id)
            tracer.instant(
                tracer.track("groups"),
                "group dropped (failed members)",
                {"group": trajectory.group_id},
                ends=members,
            )
            return None
        tracer.instant(
            tracer.track("groups"),
            "group complete",
            {"group": trajectory.group_id},
            flows=(flow_id(trajectory.group_id),),
            ends=members,
        )
        group = Group(
            group_id=trajectory.group_id,
            task_id=pending.task_id,
            trajectories=tuple(sorted(pending.members, key=lambda t: t.id)),
        )
        await self._ready.put(group)
        self.released += 1
        return group

    async def get(self) -> Group:
        return await self._ready.get()

    def get_nowait(self) -> Group | None:
        try:
            return self._ready.get_nowait()
        except asyncio.QueueEmpty:
            return None

    def stats(self) -> QueueStats:
        now = time.monotonic()
        ages = [now - p.opened for p in self._open.values()]
        return QueueStats(
            ready=self._ready.qsize(),
            half_filled=sum(0 < len(p.members) < self.group_size for p in self._open.values()),
            open=len(self._open),
            oldest_open_s=max(ages, default=0.0),
            released=self.released,
            dropped=len(self.dropped),
        )
