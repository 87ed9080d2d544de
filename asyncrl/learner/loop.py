"""The training loop: rollouts stream in as complete groups, the learner steps, weights go out.

`mode: async` streams: the orchestrator runs in the background, the learner takes the first
`batch_size / G` complete groups whenever it is ready, and the train step runs on the learner's
own thread so episodes and tools keep going meanwhile. Staleness is bounded twice: at admission
(the loop is the orchestrator's admission hook: a group may start only if it can be trained within
`max_staleness` policy versions, `state.admits`) and at consumption (a group whose oldest token is
more than `max_staleness` versions old is dropped whole). With `max_staleness = 0` and a publish
every step, admission admits exactly one batch per version, which is the synchronous schedule.
`mode: sync` is the barrier baseline: generate exactly one batch, train, publish, repeat.

Everything the loop knows is one `LoopState`; every group ends through `finish(number, outcome)`,
which moves the cursor, the counters and the admission budget together — whether the learner
trained it, the loop dropped it as stale or signal-free, the queue dropped it for a failed member,
or the run stopped before it finished. `TrainingLoop.from_state` / `loop.state()` are the only
ways in and out; a checkpoint stores the state whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from asyncrl import tracing
from asyncrl.config.learner import LearnerConfig
from asyncrl.learner.advantages import has_signal
from asyncrl.learner.hooks import LoopHooks, Phase
from asyncrl.learner.learner import Learner
from asyncrl.learner.state import LoopState, admits
from asyncrl.metrics.tracker import NullTracker, Tracker
from asyncrl.rollout.orchestrator import RolloutPlan
from asyncrl.sync.publisher import WeightPublisher
from asyncrl.tracing import flow_id
from asyncrl.tracing.counters import peak_rss_bytes
from asyncrl.types import Group, GroupOutcome, NumberedTask, Task, TrajectoryStatus


class TrainingLoop:
    def __init__(
        self,
        learner: Learner,
        plan: RolloutPlan,
        cfg: LearnerConfig,
        *,
        state: LoopState,
        hooks: LoopHooks | None = None,
        tracker: Tracker | None = None,
        device_lock: threading.Lock | None = None,
        bounded: bool | None = None,
    ) -> None:
        """Use `from_state`. `bounded` False turns the admission bound off (tests use it to
        force stale groups); by default it is on in async mode."""
        self.learner, self.cfg, self._state = learner, cfg, state
        self.hooks = hooks or LoopHooks()
        self.tracker = tracker or NullTracker()
        self.device_lock = device_lock
        self.groups_per_step = cfg.batch_size // plan.settings.group_size
        self.bounded = cfg.mode == "async" if bounded is None else bounded
        self.orchestrator = plan.build(self.finish, self)
        self.queue = self.orchestrator.queue
        self.publisher = WeightPublisher(plan.engine)
        self._changed: asyncio.Event | None = None  # made in run(): bound to its event loop
        self._start = time.monotonic()
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def from_state(
        cls, state: LoopState, learner: Learner, plan: RolloutPlan, cfg: LearnerConfig, **kw
    ) -> TrainingLoop:
        return cls(learner, plan, cfg, state=state, **kw)

    def state(self) -> LoopState:
        return self._state

    @property
    def version(self) -> int:
        return self._state.version

    # -- the one way a group ends, and admission over the same state ------------------------------

    def finish(self, number: int, outcome: GroupOutcome) -> None:
        self._state = self._state.finish(number, outcome)
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def room(self) -> None:
        per_version = self.groups_per_step * self.cfg.sync_every
        while self.bounded and not admits(self._state, per_version, self.cfg.max_staleness):
            assert self._changed is not None  # room() runs inside run()
            self._changed.clear()
            await self._changed.wait()

    def issue(self, number: int) -> None:
        self._state = self._state.issued(number)

    # -- running ---------------------------------------------------------------------------------

    async def run(
        self, task_at: Callable[[int], Task], steps: int, deadline_s: float = 0.0
    ) -> LoopState:
        """Train until the learner has taken `steps` optimizer steps (or `deadline_s` seconds)."""
        remaining = max(steps - self.learner.step, 0)  # a restored learner continues its count
        deadline = time.monotonic() + deadline_s if deadline_s else None
        items = self._state.cursor.numbered(task_at)
        self._changed = asyncio.Event()
        with ThreadPoolExecutor(1, thread_name_prefix="learner") as executor:
            self._executor = executor  # the learner's own thread: tools never starve it
            if self.cfg.mode == "sync":
                await self._run_sync(items, remaining, deadline)
            else:
                await self._run_async(items, remaining, deadline)
        return self._state

    async def _run_async(
        self, items: Iterator[NumberedTask], steps: int, deadline: float | None
    ) -> None:
        producer = asyncio.create_task(self.orchestrator.run(items))
        try:
            for _ in range(steps):
                groups = await self._collect(producer, deadline)
                if groups is None:
                    break
                await self._train(groups)
        finally:
            self.orchestrator.stop()
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            await self.orchestrator.cancel()  # withdraws every group still open
            for group in iter(self.queue.get_nowait, None):
                self.finish(group.number, GroupOutcome.WITHDRAWN)

    async def _run_sync(
        self, items: Iterator[NumberedTask], steps: int, deadline: float | None
    ) -> None:
        for _ in range(steps):
            if deadline is not None and time.monotonic() > deadline:
                break
            t0 = time.monotonic()
            await self.orchestrator.run(list(itertools.islice(items, self.groups_per_step)))
            groups = list(iter(self.queue.get_nowait, None))
            self._state = self._state.waited(time.monotonic() - t0)
            if groups:
                await self._train(groups)

    async def _collect(self, producer: asyncio.Task, deadline: float | None) -> list[Group] | None:
        """The next `groups_per_step` usable groups; None when the stream or the time ran out."""
        groups: list[Group] = []
        skipped = 0
        t0 = time.monotonic()
        while len(groups) < self.groups_per_step:
            group = await self._next_group(producer, deadline)
            if group is None:
                for g in groups:  # taken from the queue, never trained
                    self.finish(g.number, GroupOutcome.WITHDRAWN)
                return None
            self.hooks.at_phase(Phase.ROLLOUT, self.learner.step + 1)  # groups half collected
            if self._stale(group):
                continue
            if self._skippable(group, skipped):
                skipped += 1
                self.finish(group.number, GroupOutcome.NO_SIGNAL)
                continue
            groups.append(group)
        self._state = self._state.waited(time.monotonic() - t0)
        return groups

    def _skippable(self, group: Group, skipped: int) -> bool:
        """DAPO dynamic sampling: a group whose rewards are all equal carries no signal."""
        if not self.cfg.skip_no_signal_groups or skipped >= self.cfg.max_skipped_groups:
            return False
        return not has_signal([t.reward for t in group.trajectories])

    async def _next_group(self, producer: asyncio.Task, deadline: float | None) -> Group | None:
        getter = asyncio.ensure_future(self.queue.get())
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        done, _ = await asyncio.wait(
            {getter, producer}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if getter in done:
            return getter.result()
        getter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await getter
        if producer.done() and producer.exception() is not None:
            raise producer.exception()  # type: ignore[misc]
        return None  # the task stream ran out, or the deadline passed

    def _stale(self, group: Group) -> bool:
        oldest = group.version_span[0]
        lag = self._state.version - oldest
        if oldest < 0 or lag <= self.cfg.max_staleness:
            return False
        tracer = tracing.get()
        tracer.instant(
            tracer.track("groups"),
            "group dropped (stale)",
            {"group": group.group_id, "lag": lag},
            ends=(flow_id(group.group_id),),
        )
        self.finish(group.number, GroupOutcome.STALE)
        return True

    async def _train(self, groups: list[Group]) -> None:
        groups = sorted(groups, key=lambda g: g.number)
        batch = self.learner.batch_from_groups(groups)
        t0 = time.monotonic()
        flows = tuple(flow_id(g.group_id) for g in groups)
        metrics = await asyncio.get_running_loop().run_in_executor(
            self._executor, self._step_locked, batch, flows
        )
        for g in groups:
            self.finish(g.number, GroupOutcome.TRAINED)
        lags = [
            self.version - min(t.sampled_versions)
            for g in groups
            for t in g.trajectories
            if t.sampled_versions
        ]
        self._state = self._state.stepped(lags, time.monotonic() - t0)
        tracing.get().counter("policy lag", sum(lags) / max(len(lags), 1))
        step = self.learner.step
        if step % self.cfg.sync_every == 0:
            self._publish(step)
        metrics.update(self._rates())
        metrics.update(self.orchestrator.health())  # env/member failures, drops, hung threads
        metrics.update(self._step_metrics(groups, lags, time.monotonic() - t0))
        self.tracker.log(step, metrics)
        self.last_metrics = metrics
        for hook in self.hooks.after_step:
            await hook(step, self)

    def _publish(self, step: int) -> None:
        version = self._state.version + 1
        with tracing.span("publisher", "publish", {"step": step, "version": version}):
            self.publisher.publish(self.learner.params_copy(), version, step)
        self.hooks.at_phase(Phase.PUBLISH, step)  # handed over, not yet swapped in
        self._state = self._state.published(version)
        self._wake()

    def _step_metrics(self, groups: list[Group], lags: list[int], seconds: float) -> dict:
        rewards = [t.reward for g in groups for t in g.trajectories]
        occupancy = self.queue.stats()
        c = self._state.counters
        return {
            "ready_groups": float(occupancy.ready),
            "half_filled_groups": float(occupancy.half_filled),
            "active_episodes": float(self.orchestrator.active),
            "reward": sum(rewards) / len(rewards),
            "policy_lag_mean": sum(lags) / max(len(lags), 1),
            "policy_lag_max": float(max(lags, default=0)),
            "groups_dropped_stale": float(c.groups_stale),
            "groups_failed": float(c.groups_failed),
            "groups_no_signal": float(c.groups_no_signal),
            "version": float(self.version),
            "train_s": seconds,
        }

    def _rates(self) -> dict[str, float]:
        """Throughput and health counters for operators (per minute since the loop started)."""
        minutes = max(time.monotonic() - self._start, 1e-9) / 60
        finished = self.orchestrator.status_counts
        total = max(sum(finished.values()), 1)
        return {
            "trajectories_per_min": sum(finished.values()) / minutes,
            "groups_per_min": self.queue.released / minutes,
            "examples_per_min": self._state.counters.groups_trained
            * self.queue.group_size
            / minutes,
            "timeout_rate": finished[TrajectoryStatus.TIMEOUT] / total,
            **{f"status/{s.value}": float(n) for s, n in finished.items()},
            "memory_peak_bytes": float(peak_rss_bytes()),
        }

    def _step_locked(self, batch, flows=()) -> dict[str, float]:
        lock = self.device_lock or contextlib.nullcontext()
        tracer = tracing.get()
        track = tracer.track("learner")
        with lock:
            # rl_step returns host floats: the span ends when the step's arrays are ready.
            tracer.begin(track, "train step", {"step": self.learner.step + 1, "groups": len(flows)})
            try:
                return self.learner.rl_step(
                    batch, on_dispatch=lambda step: self.hooks.at_phase(Phase.TRAIN, step)
                )
            finally:
                tracer.end(track, ends=flows)
