"""`GroupQueue`: trajectories in, complete GRPO groups out, each as soon as its own members finish.

A group is released only when all G members are terminal, never waiting for unrelated groups.
Failed members (timeout, tool_error, env_error, cancelled) are handled by the configured policy:
"drop" the whole group, keep it with the failure scored 0 ("zero"), or "retry" the member (the
orchestrator re-runs it under the same group id) up to `max_retries` times, then drop. A failed
member is never silently replaced by a copy of another. A dropped group is dropped at its first
fatal failure (`put` returns `Admitted.DOOMED`), so the orchestrator can cancel the members still
running; their late results are discarded. Every group that ends without being released is
reported once to `on_end(number, outcome)`: `FAILED` when dropped, `WITHDRAWN` when the run stops
before it could finish. Released groups wait in a bounded buffer; when it is full, `put` waits
(backpressure on the producers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncrl import tracing
from asyncrl.config.rollout import FailurePolicy
from asyncrl.tracing import flow_id
from asyncrl.types import Group, GroupOutcome, NumberedTask, Trajectory, TrajectoryStatus

FAILED = frozenset(
    {
        TrajectoryStatus.TIMEOUT,
        TrajectoryStatus.TOOL_ERROR,
        TrajectoryStatus.ENV_ERROR,
        TrajectoryStatus.CANCELLED,
    }
)

GroupEnd = Callable[[int, GroupOutcome], None]


class Admitted(enum.Enum):
    """What `put` did with a member."""

    PENDING = "pending"  # kept; the group still waits for other members
    RELEASED = "released"  # it completed the group, which went to the learner's buffer
    DOOMED = "doomed"  # it failed the group for good: the group was dropped
    DISCARDED = "discarded"  # its group had already ended (dropped or withdrawn)


@dataclass(slots=True)
class _Pending:
    number: int
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
    withdrawn: int
    discarded_members: int  # late results of groups that had already ended


class GroupQueue:
    def __init__(
        self,
        group_size: int,
        policy: FailurePolicy = "zero",
        max_retries: int = 2,
        max_ready: int = 16,
        on_end: GroupEnd | None = None,
    ) -> None:
        self.group_size = group_size
        self.policy = policy
        self.max_retries = max_retries
        self.on_end = on_end
        self._open: dict[str, _Pending] = {}
        self._ready: asyncio.Queue[Group] = asyncio.Queue(max_ready)
        self.released = 0
        self.dropped = 0
        self.withdrawn = 0
        self.discarded = 0

    def open(self, item: NumberedTask) -> None:
        if item.group_id in self._open:
            raise ValueError(f"group {item.group_id} is already open")
        self._open[item.group_id] = _Pending(item.number, item.task.id, time.monotonic())

    def is_open(self, group_id: str) -> bool:
        return group_id in self._open

    def should_retry(self, trajectory: Trajectory, attempt: int) -> bool:
        """Whether the orchestrator should re-run this member instead of `put`ting it."""
        return self.policy == "retry" and trajectory.status in FAILED and attempt < self.max_retries

    async def put(self, trajectory: Trajectory) -> Admitted:
        """Add a terminal member of an open group (see `Admitted` for the outcomes)."""
        pending = self._open.get(trajectory.group_id)
        if pending is None:
            self.discarded += 1
            return Admitted.DISCARDED
        if trajectory.status in FAILED:
            if self.policy != "zero":
                pending.members.append(trajectory)
                self._end(trajectory.group_id, GroupOutcome.FAILED, "group dropped (failed member)")
                return Admitted.DOOMED
            pending.failed = True
            trajectory = dataclasses.replace(trajectory, reward=0.0)
        pending.members.append(trajectory)
        if len(pending.members) < self.group_size:
            return Admitted.PENDING
        del self._open[trajectory.group_id]
        tracer = tracing.get()
        if tracer.enabled:  # flow ids are hashes: none computed for a tracer that drops them
            tracer.instant(
                tracer.track("groups"),
                "group complete",
                {"group": trajectory.group_id},
                flows=(flow_id(trajectory.group_id),),
                ends=tuple(flow_id(t.id) for t in pending.members),
            )
        group = Group(
            group_id=trajectory.group_id,
            number=pending.number,
            task_id=pending.task_id,
            trajectories=tuple(sorted(pending.members, key=lambda t: t.id)),
        )
        await self._ready.put(group)
        self.released += 1
        return Admitted.RELEASED

    def fail(self, group_id: str) -> bool:
        """A member could not run at all (no record to put): the group is dropped whatever the
        policy. False when the group had already ended."""
        if group_id not in self._open:
            return False
        self._end(group_id, GroupOutcome.FAILED, "group dropped (member could not run)")
        return True

    def withdraw(self, group_id: str) -> None:
        """The run stops before this group can finish: it ends unreleased (issued again later)."""
        if group_id in self._open:
            self._end(group_id, GroupOutcome.WITHDRAWN, "group withdrawn")

    def withdraw_open(self) -> None:
        """Withdraw every group still open (the run is over)."""
        for group_id in list(self._open):
            self.withdraw(group_id)

    def _end(self, group_id: str, outcome: GroupOutcome, what: str) -> None:
        pending = self._open.pop(group_id)
        if outcome == GroupOutcome.FAILED:
            self.dropped += 1
        else:
            self.withdrawn += 1
        tracer = tracing.get()
        tracer.instant(
            tracer.track("groups"),
            what,
            {"group": group_id},
            ends=tuple(flow_id(t.id) for t in pending.members),
        )
        if self.on_end is not None:
            self.on_end(pending.number, outcome)

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
            dropped=self.dropped,
            withdrawn=self.withdrawn,
            discarded_members=self.discarded,
        )
