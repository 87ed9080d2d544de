"""The orchestrator: keeps up to `max_concurrency` episodes running, G per task under one group id.

It starts a new group only when (1) the admission hook has room (the learner's staleness bound:
no generation that could not be trained in time) and (2) enough episode slots are free for its
members. Finished members go to the `GroupQueue`; failed ones are re-run there when the failure
policy says "retry". One slow episode holds only its own slot. When a member's failure dooms its
group (policy "drop", or "retry" with the retries spent), the group's other members are cancelled
at once (unless `cancel_doomed` is off): nothing is generated for a group that will be thrown away.

`stop()` starts no new groups and lets running ones finish; a group caught half-started is
withdrawn (its started members cancelled, the queue told), never left open. `cancel()` cancels
every running episode (recorded as cancelled) and withdraws every group still open. The
orchestrator knows nothing of the learner beyond the admission hook.

Every member ends with a status that is counted (`status_counts`), whatever its environment does:
a factory that raises (or a task naming an unregistered environment) is logged and counted
(`env_build_failures`) and the member ends as env_error; a close that fails or hangs is counted
(`env_close_failures`) without changing the status; a member that cannot run at all (a bug below
the episode) is logged with its traceback, counted as env_error and drops its group, so no group
is ever left open. An episode ends within its timeout plus `EPISODE_GRACE_S` (rollout/episode.py),
so `cancel()` returns within that grace too.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Protocol

from asyncrl import tracing
from asyncrl.agents import Agent
from asyncrl.config.rollout import FailurePolicy
from asyncrl.envs.base import Environment
from asyncrl.rollout.episode import Episode, EpisodeLimits, EpisodeSpec
from asyncrl.rollout.groups import Admitted, GroupEnd, GroupQueue
from asyncrl.sampling.protocol import EngineClosed, RolloutEngine
from asyncrl.tools import deadlines, threads
from asyncrl.tracing import flow_id
from asyncrl.types import NumberedTask, SamplingParams, Task, Trajectory, TrajectoryStatus

log = logging.getLogger(__name__)


class _Unbuilt:
    """Stands in for an environment whose factory raised: its reset raises the same error, so the
    episode ends as `env_error` with a recorded status like any other environment failure."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def reset(self, task: Task) -> tuple:
        raise self.error

    async def step(self, action: object) -> object:
        raise self.error

    async def close(self) -> None:
        return None


@dataclass(slots=True)
class _Filling:
    """A group whose members are being started: the next member's index, and the run task's
    wait for the rest (set once every member started or the group was left)."""

    item: NumberedTask
    member: int = 0
    waiter: asyncio.Future[None] | None = None


class Admission(Protocol):
    async def room(self) -> None:
        """Return when a new group may start."""
        ...

    def issue(self, number: int) -> None:
        """Group `number` starts now (called right after `room()` returned)."""
        ...


class Unbounded:
    """No admission bound: every group may start at once (evaluation, tests, sync batches)."""

    async def room(self) -> None:
        return None

    def issue(self, number: int) -> None:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class OrchestratorSettings:
    group_size: int
    max_concurrency: int
    limits: EpisodeLimits
    sampling: SamplingParams
    seed: int = 0
    cancel_doomed: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutPlan:
    """Everything needed to run a training run's episodes: the engine, the orchestrator's
    settings and factories, and the group queue's failure policy and buffer."""

    engine: RolloutEngine
    settings: OrchestratorSettings
    make_env: Callable[[Task], Environment]
    make_agent: Callable[[], Agent]
    failure_policy: FailurePolicy = "zero"
    max_retries: int = 2
    max_ready: int = 16

    def build(self, on_end: GroupEnd | None, admission: Admission | None) -> Orchestrator:
        """An orchestrator with its own queue (`orchestrator.queue`)."""
        queue = GroupQueue(
            self.settings.group_size,
            self.failure_policy,
            self.max_retries,
            self.max_ready,
            on_end=on_end,
        )
        return Orchestrator(
            self.engine,
            queue,
            self.settings,
            make_env=self.make_env,
            make_agent=self.make_agent,
            admission=admission,
        )


def member_seed(seed: int, group_id: str, member: int, attempt: int) -> int:
    """A distinct sampling seed per (run, group, member, attempt): group members never share one."""
    digest = hashlib.sha256(f"{seed}/{group_id}/{member}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def numbered(tasks: Iterable[Task], start: int = 0) -> Iterable[NumberedTask]:
    """Tasks numbered in order (groups of a stream that was never restored)."""
    return (NumberedTask(number=start + i, task=t) for i, t in enumerate(tasks))


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
    ) -> None:
        self.engine, self.queue, self.settings = engine, queue, settings
        self.make_env, self.make_agent = make_env, make_agent
        self.admission: Admission = admission or Unbounded()
        self._free = settings.max_concurrency  # episode slots not held by a member
        self._filling: _Filling | None = None  # the group whose members are being started
        self._running: set[asyncio.Task] = set()
        self._started: set[asyncio.Task] = set()  # members whose coroutine began
        self._holding: set[asyncio.Task] = set()  # members that still hold their slot
        self._sampling_base: SamplingParams | None = None
        self._sampling_fields: dict[str, object] = {}
        self._members: dict[str, set[asyncio.Task]] = collections.defaultdict(set)
        self._stopping = False
        self.groups_started = 0
        self.retries = 0
        self.doomed_cancelled = 0  # members cancelled because their group was already lost
        self.env_build_failures = 0  # environment factories that raised
        self.env_close_failures = 0  # environment closes that raised or were dropped
        self.member_failures = 0  # members that could not run at all (their group was dropped)
        self.status_counts: collections.Counter[TrajectoryStatus] = collections.Counter()

    @property
    def active(self) -> int:
        return len(self._running)

    @property
    def free_slots(self) -> int:
        """Episode slots no member holds (`max_concurrency` once every member has ended)."""
        return self._free

    def health(self) -> dict[str, float]:
        """Failure counters for an operator's per-step metrics: this orchestrator's, the code
        dropped for ignoring cancellation (process-wide, `tools/deadlines.DROPPED`) and the
        shared sync-tool pools' threads (`tools/threads.shared_stats`)."""
        pools = threads.shared_stats()
        return {
            "env_build_failures": float(self.env_build_failures),
            "env_close_failures": float(self.env_close_failures),
            "member_failures": float(self.member_failures),
            "doomed_cancelled": float(self.doomed_cancelled),
            "dropped_after_grace": float(sum(deadlines.DROPPED.values())),
            "tool_threads": float(pools.threads),
            "tool_threads_abandoned_now": float(pools.abandoned_now),
            "tool_threads_abandoned_total": float(pools.abandoned_total),
            "tool_calls_skipped_total": float(pools.skipped_total),
        }

    async def run(self, items: Iterable[NumberedTask]) -> None:
        """Start a group per item until they run out or `stop()`; wait for running episodes.

        The item's number names the group, so a re-issued group keeps its id and sampling seeds.
        """
        try:
            for item in items:
                if self._stopping:
                    break
                await self.admission.room()
                if self._stopping:
                    break
                if self.engine.exhausted:
                    raise EngineClosed("no rollout engine is left to serve episodes")
                await self._start_group(item)
            await self.drain()
        except asyncio.CancelledError:
            await self.cancel()
            raise

    async def _start_group(self, item: NumberedTask) -> None:
        """Open the group and start its members; return once all are started or it was left
        (doomed by a member, or withdrawn by `stop()`)."""
        self.groups_started += 1
        self.admission.issue(item.number)
        self.queue.open(item)
        filling = self._filling = _Filling(item)
        self._fill()
        if self._filling is filling:  # out of slots: members that end start the rest
            filling.waiter = asyncio.get_running_loop().create_future()
            await filling.waiter

    def _fill(self) -> None:
        """Start the filling group's members while slots are free. Called when a group starts
        and whenever a slot is freed, so a member that ends starts the next one in its own step,
        not a hop later through a waiting task (each hop is one more event-loop wake-up)."""
        filling = self._filling
        if filling is None:
            return
        group_id = filling.item.group_id
        while filling.member < self.settings.group_size:
            if self._stopping or not self.queue.is_open(group_id):
                # Stopped while waiting for a slot (withdraw the half-started group), or a
                # started member already doomed it (start nothing more for it).
                if self._stopping:
                    self._withdraw(group_id)
                break
            if not self._free:
                return
            self._free -= 1
            self._launch(filling.item, filling.member)
            filling.member += 1
        self._filling = None
        if filling.waiter is not None and not filling.waiter.done():
            filling.waiter.set_result(None)

    def _launch(self, item: NumberedTask, member: int) -> None:
        job = asyncio.create_task(self._member(item, member), name=item.group_id)
        self._running.add(job)
        self._holding.add(job)
        self._members[item.group_id].add(job)
        job.add_done_callback(self._forget(item.group_id))

    def _release(self, job: asyncio.Task) -> None:
        """Free `job`'s slot (once) and start what waits for it."""
        if job in self._holding:
            self._holding.discard(job)
            self._free += 1
            self._fill()

    def _forget(self, group_id: str) -> Callable[[asyncio.Task], None]:
        def done(job: asyncio.Task) -> None:
            # A member that ends normally frees its slot itself; one cancelled (before its first
            # step, when it never runs its own code at all) or failing frees it here.
            self._release(job)
            if job not in self._started:
                self.status_counts[TrajectoryStatus.CANCELLED] += 1
            self._started.discard(job)
            self._running.discard(job)
            members = self._members.get(group_id)
            if members is not None:
                members.discard(job)
                if not members:
                    del self._members[group_id]

        return done

    async def _member(self, item: NumberedTask, member: int) -> None:
        job = asyncio.current_task()
        self._started.add(job)
        attempt = 0
        while True:
            trajectory = await self._episode(item, member, attempt)
            if trajectory is None:
                break
            self.status_counts[trajectory.status] += 1
            if not self.queue.should_retry(trajectory, attempt):
                if await self.queue.put(trajectory) == Admitted.DOOMED:
                    self._cancel_members(item.group_id)
                break
            tracer = tracing.get()  # the failed attempt's flow ends here
            tracer.instant(tracer.track("rollout"), "retry", ends=(flow_id(trajectory.id),))
            attempt += 1
            self.retries += 1
        # Not in a `finally`: a cancelled member leaves its slot to the done callback, so
        # nothing new starts from a task that is being cancelled (say, at the loop's shutdown).
        self._release(job)

    def _cancel_members(self, group_id: str) -> None:
        if not self.settings.cancel_doomed:
            return
        current = asyncio.current_task()
        for job in list(self._members.get(group_id, ())):
            if job is not current and not job.done():
                job.cancel()
                self.doomed_cancelled += 1

    def _withdraw(self, group_id: str) -> None:
        self.queue.withdraw(group_id)
        current = asyncio.current_task()  # a member of the group that just ended normally
        for job in list(self._members.get(group_id, ())):
            if job is not current:
                job.cancel()

    async def _episode(self, item: NumberedTask, member: int, attempt: int) -> Trajectory | None:
        """The member's trajectory, or None when it could not run (its group is then dropped).

        One coroutine, not a guard around another: every resumption of the episode passes
        through each frame of the await chain."""
        episode = None
        try:
            episode = self._build_episode(item, member, attempt)
            return await episode.run()
        except asyncio.CancelledError:
            if episode is not None:
                self.status_counts[TrajectoryStatus.CANCELLED] += 1
            raise
        except Exception:
            log.exception("group %s member %d could not run", item.group_id, member)
            self.member_failures += 1
            self.status_counts[TrajectoryStatus.ENV_ERROR] += 1
            if self.queue.fail(item.group_id):
                self._cancel_members(item.group_id)
            return None
        finally:
            if episode is not None and episode.close_error:
                self.env_close_failures += 1

    def _build_episode(self, item: NumberedTask, member: int, attempt: int) -> Episode:
        s = self.settings
        group_id = item.group_id
        spec = EpisodeSpec(
            episode_id=f"{group_id}/{member}" + (f"~{attempt}" if attempt else ""),
            group_id=group_id,
            task=item.task,
            sampling=self._member_sampling(member_seed(s.seed, group_id, member, attempt)),
            attempt=attempt,
            replay=item.replay,
        )
        try:
            env = self.make_env(item.task)
        except Exception as e:  # a factory bug or an unregistered environment: this group's only
            log.warning("environment for task %s could not be built: %.200s", item.task.id, e)
            self.env_build_failures += 1
            env = _Unbuilt(e)
        return Episode(spec, self.engine, self.make_agent(), env, s.limits)

    def _member_sampling(self, seed: int) -> SamplingParams:
        """The settings' sampling with a member's seed (`replace` reads the fields every time)."""
        base = self.settings.sampling
        if base is not self._sampling_base:  # the settings can be swapped between runs
            names = (f.name for f in fields(base) if f.name != "seed")
            self._sampling_base = base
            self._sampling_fields = {name: getattr(base, name) for name in names}
        return SamplingParams(**self._sampling_fields, seed=seed)

    def stop(self) -> None:
        """Start no new groups; running episodes finish normally."""
        self._stopping = True

    async def drain(self) -> None:
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def cancel(self) -> None:
        """Stop, cancel every running episode (each closes its environment), wait for them, and
        withdraw every group that is still open."""
        self._stopping = True
        while self._running:
            jobs = list(self._running)
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
        self.queue.withdraw_open()
