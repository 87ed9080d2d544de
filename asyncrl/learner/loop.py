"""The training loop: rollouts stream in as complete groups, the learner steps, weights go out.

`mode: async` streams: the orchestrator runs in the background, the learner takes the first
`batch_size / G` complete groups whenever it is ready, and the train step runs in a worker thread so
episodes and tools keep going meanwhile. Staleness is bounded twice: at admission
(`StalenessAdmission`: a group may start only if it can be trained within `max_staleness` policy
versions, so no generation is wasted) and at consumption (a group whose oldest token is more than
`max_staleness` versions old is dropped whole and counted). With `max_staleness = 0` and a publish
every step, admission admits exactly one batch per version, which is the synchronous schedule.
`mode: sync` is the barrier baseline: generate exactly one batch, train, publish, repeat.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from asyncrl import tracing
from asyncrl.checkpoint import faults
from asyncrl.config.learner import LearnerConfig
from asyncrl.envs.base import Task
from asyncrl.learner.learner import Learner
from asyncrl.metrics.tracker import NullTracker, Tracker
from asyncrl.rollout.cursor import DataCursor
from asyncrl.rollout.groups import GroupQueue
from asyncrl.rollout.orchestrator import NumberedTask, Orchestrator
from asyncrl.sync.publisher import WeightPublisher
from asyncrl.tracing import flow_id
from asyncrl.tracing.counters import peak_rss_bytes
from asyncrl.types import Group, TrajectoryStatus


class StalenessAdmission:
    """Admit the n-th group only while n < (version + max_staleness + 1) × groups per version
    (groups per step × `sync_every`).

    Groups that were dropped (stale, or failed under the "drop" policy) are not counted: they
    free their place in the budget.
    """

    def __init__(self, groups_per_step: int, max_staleness: int) -> None:
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.version = 0
        self.started = 0
        self.dropped = 0
        self._changed = asyncio.Event()

    def budget(self) -> int:
        return (self.version + self.max_staleness + 1) * self.groups_per_step + self.dropped

    async def wait(self) -> None:
        while self.started >= self.budget():
            self._changed.clear()
            await self._changed.wait()
        self.started += 1

    def advance(self, version: int) -> None:
        self.version = version
        self._changed.set()

    def forgive(self, n: int = 1) -> None:
        self.dropped += n
        self._changed.set()


# Periodic work after a step (evaluate, checkpoint): `await hook(step, loop)`.
Hook = Callable[[int, "TrainingLoop"], Awaitable[None]]


@dataclass(slots=True)
class LoopStats:
    steps: int = 0
    groups_trained: int = 0
    groups_dropped_stale: int = 0
    lags: list[int] = field(default_factory=list)  # per trained trajectory: version − oldest token
    train_seconds: float = 0.0
    wait_seconds: float = 0.0  # learner idle, waiting for groups

    def counters(self) -> dict[str, float]:
        """The totals a checkpoint keeps (lags as a histogram: lag -> trajectories)."""
        histogram = collections.Counter(self.lags)
        return {
            "steps": self.steps,
            "groups_trained": self.groups_trained,
            "groups_dropped_stale": self.groups_dropped_stale,
            "train_seconds": self.train_seconds,
            "wait_seconds": self.wait_seconds,
            **{f"lag/{lag}": n for lag, n in sorted(histogram.items())},
        }

    @classmethod
    def from_counters(cls, counters: dict[str, float]) -> LoopStats:
        lags = [
            int(k[4:]) for k, n in counters.items() if k.startswith("lag/") for _ in range(int(n))
        ]
        return cls(
            steps=int(counters.get("steps", 0)),
            groups_trained=int(counters.get("groups_trained", 0)),
            groups_dropped_stale=int(counters.get("groups_dropped_stale", 0)),
            lags=lags,
            train_seconds=float(counters.get("train_seconds", 0.0)),
            wait_seconds=float(counters.get("wait_seconds", 0.0)),
        )


class TrainingLoop:
    def __init__(
        self,
        learner: Learner,
        publisher: WeightPublisher,
        orchestrator: Orchestrator,
        queue: GroupQueue,
        cfg: LearnerConfig,
        *,
        groups_per_step: int,
        admission: StalenessAdmission | None = None,
        device_lock: threading.Lock | None = None,
        tracker: Tracker | None = None,
        hooks: tuple[Hook, ...] = (),
        cursor: DataCursor | None = None,
        stats: LoopStats | None = None,
    ) -> None:
        self.learner, self.publisher, self.orchestrator = learner, publisher, orchestrator
        self.cursor = cursor or DataCursor()
        self.queue, self.cfg = queue, cfg
        self.groups_per_step = groups_per_step
        self.admission = admission
        self.device_lock = device_lock
        self.tracker = tracker or NullTracker()
        self.hooks = hooks
        self.stats = stats or LoopStats()
        self._start = time.monotonic()
        self._failed_seen = 0
        self.last_metrics: dict[str, float] = {}

    @property
    def version(self) -> int:
        return self.publisher.version

    async def run(
        self, tasks: Iterator[Task] | Iterator[NumberedTask], steps: int, deadline_s: float = 0.0
    ) -> LoopStats:
        """Train until the learner has taken `steps` optimizer steps (or `deadline_s` seconds)."""
        steps = max(steps - self.learner.step, 0)  # a restored learner continues its count
        if self.cfg.mode == "sync":
            return await self._run_sync(tasks, steps, deadline_s)
        producer = asyncio.create_task(self.orchestrator.run(tasks))
        try:
            for _ in range(steps):
                if deadline_s and time.monotonic() - self._start > deadline_s:
                    break
                groups = await self._collect(producer)
                if groups is None:
                    break
                await self._train(groups)
        finally:
            self.orchestrator.stop()
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            await self.orchestrator.cancel()
        return self.stats

    async def _run_sync(self, tasks: Iterator[Task], steps: int, deadline_s: float) -> LoopStats:
        for _ in range(steps):
            if deadline_s and time.monotonic() - self._start > deadline_s:
                break
            batch_tasks = [t for _, t in zip(range(self.groups_per_step), tasks, strict=False)]
            if not batch_tasks:
                break
            t0 = time.monotonic()
            await self.orchestrator.run(batch_tasks)
            groups = [g for g in iter(self.queue.get_nowait, None)]
            self.stats.wait_seconds += time.monotonic() - t0
            if groups:
                await self._train(groups)
        return self.stats

    async def _collect(self, producer: asyncio.Task) -> list[Group] | None:
        """The next `groups_per_step` fresh groups; stale ones are dropped and counted."""
        groups: list[Group] = []
        t0 = time.monotonic()
        while len(groups) < self.groups_per_step:
            getter = asyncio.ensure_future(self.queue.get())
            done, _ = await asyncio.wait({getter, producer}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
                if producer.exception() is not None:
                    raise producer.exception()
                return None  # the task stream ran out
            group = getter.result()
            faults.point(faults.Phase.ROLLOUT, self.learner.step + 1)  # a step's groups half in
            oldest = group.version_span[0]
            if oldest >= 0 and self.version - oldest > self.cfg.max_staleness:
                self.stats.groups_dropped_stale += 1
                self.cursor.finish(_group_number(group.group_id), trained=False)
                tracer = tracing.get()
                tracer.instant(
                    tracer.track("groups"),
                    "group dropped (stale)",
                    {"group": group.group_id, "lag": self.version - oldest},
                    ends=(flow_id(group.group_id),),
                )
                if self.admission is not None:
                    self.admission.forgive()
                continue
            groups.append(group)
        self.stats.wait_seconds += time.monotonic() - t0
        return groups

    async def _train(self, groups: list[Group]) -> None:
        groups = sorted(groups, key=lambda g: _group_number(g.group_id))
        batch = self.learner.batch_from_groups(groups)
        t0 = time.monotonic()
        flows = tuple(flow_id(g.group_id) for g in groups)
        metrics = await asyncio.to_thread(self._step_locked, batch, flows)
        self.stats.train_seconds += time.monotonic() - t0
        self.stats.steps += 1
        self.stats.groups_trained += len(groups)
        for g in groups:
            self.cursor.finish(_group_number(g.group_id), trained=True)
        self.reconcile_failed()
        lags = [
            self.version - min(t.sampled_versions)
            for g in groups
            for t in g.trajectories
            if t.sampled_versions
        ]
        self.stats.lags.extend(lags)
        step = self.learner.step
        tracer = tracing.get()
        tracer.counter("policy lag", sum(lags) / max(len(lags), 1))
        if step % self.cfg.sync_every == 0:
            with tracing.span("publisher", "publish", {"step": step}):
                version = self.publisher.publish(self.learner.params_copy(), step)
            if self.admission is not None:
                self.admission.advance(version)
        rewards = [t.reward for g in groups for t in g.trajectories]
        occupancy = self.queue.stats()
        metrics.update(self._rates())
        metrics.update(
            ready_groups=float(occupancy.ready),
            half_filled_groups=float(occupancy.half_filled),
            active_episodes=float(self.orchestrator.active),
            reward=sum(rewards) / len(rewards),
            policy_lag_mean=sum(lags) / max(len(lags), 1),
            policy_lag_max=float(max(lags, default=0)),
            groups_dropped_stale=float(self.stats.groups_dropped_stale),
            version=float(self.version),
            train_s=time.monotonic() - t0,
        )
        self.tracker.log(step, metrics)
        self.last_metrics = metrics
        for hook in self.hooks:
            await hook(step, self)

    def _rates(self) -> dict[str, float]:
        """Throughput and health counters for operators (per minute since the loop started)."""
        minutes = max(time.monotonic() - self._start, 1e-9) / 60
        finished = self.orchestrator.status_counts
        total = max(sum(finished.values()), 1)
        return {
            "trajectories_per_min": sum(finished.values()) / minutes,
            "groups_per_min": self.queue.released / minutes,
            "examples_per_min": self.stats.groups_trained * self.queue.group_size / minutes,
            "timeout_rate": finished[TrajectoryStatus.TIMEOUT] / total,
            **{f"status/{s.value}": float(n) for s, n in finished.items()},
            "memory_peak_bytes": float(peak_rss_bytes()),
        }

    def reconcile_failed(self) -> None:
        """Groups the queue dropped for failed members are finished (not trained) in the cursor."""
        dropped = self.queue.dropped
        for group_id in dropped[self._failed_seen :]:
            self.cursor.finish(_group_number(group_id), trained=False)
        self._failed_seen = len(dropped)

    def _step_locked(self, batch, flows=()):
        lock = self.device_lock or contextlib.nullcontext()
        tracer = tracing.get()
        track = tracer.track("learner")
        with lock:
            # rl_step returns host floats: the span ends when the step's arrays are ready.
            tracer.begin(track, "train step", {"step": self.learner.step + 1, "groups": len(flows)})
            try:
                return self.learner.rl_step(
                    batch, on_dispatch=lambda step: faults.point(faults.Phase.TRAIN, step)
                )
            finally:
                tracer.end(track, ends=flows)


def _group_number(group_id: str) -> int:
    """Groups are numbered in start order ("task@n"); a batch is ordered by it."""
    return int(group_id.rsplit("@", 1)[1])
