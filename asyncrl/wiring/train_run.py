"""The train stage's event-loop side: held-out evaluation, checkpoints and progress, as the
hooks of a `TrainingLoop`.

`TrainRun.main` evaluates the starting policy (unless the restored record already has), runs the
loop with a counter sampler beside it, evaluates the final policy, saves the last checkpoint and
waits for it. The loop calls `after_step` (evaluate / save every N steps, progress line) and
`at_phase` (the stage's fault point, if any); the step record, when the stage installs one
(`wiring/step_record.py`), runs before `after_step`. Saving is skipped when the learner has not
stepped since the last save, so a restored state is never written back as new. Saves and waits go
through `wiring/lockstep.py`, so on a multi-host trainer (this is process 0) every process takes
part. It reads no environment and writes no files besides the checkpointer's (and the step
record's, when installed).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from asyncrl import tracing
from asyncrl.checkpoint.manager import Checkpointer
from asyncrl.checkpoint.train_record import TrainRecord
from asyncrl.config import RunConfig
from asyncrl.learner.hooks import AfterStep, LoopHooks, Phase, PhasePoint
from asyncrl.learner.learner import Learner
from asyncrl.learner.loop import TrainingLoop
from asyncrl.learner.state import LoopState
from asyncrl.metrics.progress import Progress
from asyncrl.metrics.tracker import Tracker
from asyncrl.sampling.protocol import RolloutEngine
from asyncrl.tracing.counters import CounterSampler
from asyncrl.wiring import lockstep
from asyncrl.wiring.devices import Placement
from asyncrl.wiring.episodes import Wiring
from asyncrl.wiring.training import rollout_plan, training_tasks


@dataclass(eq=False, kw_only=True)
class TrainRun:
    """One training run's event-loop side: evaluation, checkpoint and progress around the loop."""

    cfg: RunConfig
    wiring: Wiring
    learner: Learner
    engine: RolloutEngine
    placement: Placement
    tracker: Tracker
    checkpointer: Checkpointer
    kill: PhasePoint | None = None  # the fault point the stage installs (wiring/faults.py)
    record: AfterStep | None = None  # the opt-in step record (wiring/step_record.py), first
    evals: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.saved_step = self.learner.step  # restored (or initial) state: nothing new to save
        self.progress = Progress(self.cfg.learner.steps, "train")

    def at_phase(self, phase: Phase, step: int) -> None:
        if self.kill is not None:
            self.kill(phase, step)

    async def evaluate(self, step: int) -> None:
        start = time.monotonic()
        with tracing.span("rollout", "held-out evaluation", {"step": step}):
            summary = await self.wiring.evaluate(self.engine, tag=f"eval{step}")
        # Every rate with its interval (per family too), the failure breakdown and the statuses
        # (EvalSummary.row), and the seconds the evaluation took: time-to-quality figures
        # subtract it from elapsed time.
        row = {**summary.row(), "eval_s": round(time.monotonic() - start, 3)}
        self.evals.append({"step": float(step), **row})
        self.tracker.log(step, row, kind="eval")

    async def after_step(self, step: int, loop: TrainingLoop) -> None:
        every = self.cfg.learner.eval_every
        if every and step % every == 0:
            await self.evaluate(step)
        every = self.cfg.checkpoint.every_steps
        if every and step % every == 0:
            self.save(loop.state())
        m = loop.last_metrics
        shown = {
            "reward": f"{m.get('reward', 0):.3f}",
            "lag": f"{m.get('policy_lag_mean', 0):.2f}",
            "groups/min": f"{m.get('groups_per_min', 0):.0f}",
        }
        if "entropy" in m:
            shown["entropy"] = f"{m['entropy']:.3f}"
        self.progress.update(step, shown)

    def save(self, state: LoopState) -> None:
        step = self.learner.step
        if self.saved_step == step:
            return
        self.saved_step = step
        record = TrainRecord.of(state, tuple(self.evals), self.cfg)
        with tracing.span("checkpointer", "checkpoint save", {"step": step}):
            lockstep.save(self.learner, self.checkpointer, record.to_json())
        self.at_phase(Phase.CHECKPOINT, step)  # Orbax writing in the background

    def _after_step_hooks(self) -> tuple[AfterStep, ...]:
        return (self.record, self.after_step) if self.record else (self.after_step,)

    async def main(self, restored: LoopState) -> LoopState:
        cfg = self.cfg
        if not self.evals:
            await self.evaluate(self.learner.step)
        loop = TrainingLoop.from_state(
            restored,
            self.learner,
            rollout_plan(cfg, self.wiring, self.engine),
            cfg.learner,
            hooks=LoopHooks(after_step=self._after_step_hooks(), at_phase=self.at_phase),
            tracker=self.tracker,
            device_lock=self.placement.device_lock,
        )
        sampler = CounterSampler(
            self.engine, loop.orchestrator, loop.queue, cfg.tracing.counter_interval_s
        )
        sampling = asyncio.create_task(sampler.run())
        try:
            state = await loop.run(
                training_tasks(cfg).at, cfg.learner.steps, cfg.learner.time_budget_s
            )
        finally:
            sampling.cancel()
        if self.evals[-1]["step"] != self.learner.step:
            await self.evaluate(self.learner.step)
        self.save(state)
        with tracing.span("checkpointer", "checkpoint finalize"):
            lockstep.wait(self.learner, self.checkpointer)
        self.progress.close()
        return state
