"""Stage: asynchronous agentic GRPO, wired from the configuration.

Builds the placement (colocated or disaggregated devices), the learner on the train mesh, the
engine on the rollout devices, the publisher, the group queue, the orchestrator with its
staleness admission, and the training loop with an evaluation hook; runs it; writes the trained
model (HF safetensors), the metrics (JSONL) and the learning curve (PNG) under `<run>/train/`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import jax.numpy as jnp

from asyncrl import tracing
from asyncrl.checkpoint import faults
from asyncrl.checkpoint.manager import Checkpointer, CheckpointError, digest, flatten
from asyncrl.checkpoint.pipeline_state import PipelineState, incompatibilities
from asyncrl.config import RunConfig, to_yaml
from asyncrl.envs.base import Task
from asyncrl.envs.tasks import task_stream
from asyncrl.learner.learner import Learner
from asyncrl.learner.loop import LoopStats, StalenessAdmission, TrainingLoop
from asyncrl.metrics.plots import lag_histogram, learning_curve, queue_occupancy, reward_curve
from asyncrl.metrics.progress import Progress
from asyncrl.metrics.tracker import JsonlTracker, TensorBoardTracker, Trackers
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf
from asyncrl.rollout.groups import GroupQueue
from asyncrl.rollout.orchestrator import Orchestrator, OrchestratorSettings
from asyncrl.stages.common import Wiring
from asyncrl.stages.runtime import make_placement
from asyncrl.sync.publisher import WeightPublisher
from asyncrl.tracing.counters import CounterSampler

RESULT_FILE = "train.json"
RESUME_FILE = "resume.json"
TRACE_FILE = "trace.perfetto-trace"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainResult:
    model_dir: str
    steps: int
    seconds: float
    initial_solve_rate: float
    final_solve_rate: float
    groups_trained: int
    groups_dropped_stale: int
    policy_lag_mean: float
    policy_lag_max: int
    learner_idle_fraction: float
    curve: str


class TaskStream:
    """Epoch after epoch over the training split, each epoch in its own seeded order.

    Task n is a pure function of the config (`at(n)`), so a restored data cursor can re-issue
    group n and continue from any position.
    """

    def __init__(self, cfg: RunConfig) -> None:
        self.tasks = list(task_stream(cfg.env.tasks, "train", cfg.env.train_size, cfg.env.seed))
        self.seed = cfg.seed
        self._epoch, self._order = -1, self.tasks

    def at(self, n: int) -> Task:
        epoch, i = divmod(n, len(self.tasks))
        if epoch != self._epoch:
            self._order = list(self.tasks)
            random.Random(f"{self.seed}/{epoch}").shuffle(self._order)
            self._epoch = epoch
        return self._order[i]

    def __iter__(self) -> Iterator[Task]:
        return (self.at(n) for n in itertools.count())


def training_tasks(cfg: RunConfig) -> TaskStream:
    return TaskStream(cfg)


def checkpoint_uri(cfg: RunConfig, run_dir: Path) -> str:
    return cfg.checkpoint.dir or str(run_dir / "checkpoints")


def resume(checkpointer: Checkpointer, learner: Learner, cfg: RunConfig) -> PipelineState:
    """Restore the learner from the newest complete checkpoint; a fresh state when there is none."""
    step = checkpointer.latest_step()
    if step is None:
        return PipelineState()
    saved = checkpointer.read_pipeline(step)
    diffs = incompatibilities(saved.get("config", {}), cfg.to_dict())
    if diffs:
        raise CheckpointError(
            f"checkpoint step {step} at {checkpointer.uri} was made by an incompatible config:\n  "
            + "\n  ".join(diffs)
        )
    learner.state, saved = checkpointer.restore(learner.state, step)
    return PipelineState.from_json(saved)


def train(cfg: RunConfig, run_dir: Path, init_model: str | None = None) -> TrainResult:
    """Train (or resume, when the run's checkpoint location holds a complete checkpoint)."""
    start = time.monotonic()
    out = run_dir / "train"
    out.mkdir(parents=True, exist_ok=True)
    wiring = Wiring.of(cfg)
    placement = make_placement(cfg)
    model = build_model(cfg.model, seed=cfg.seed)
    source = init_model or cfg.model.checkpoint
    if source:
        hf.load_into(model, source)
    learner = Learner(model, cfg.learner, max_len=cfg.env.max_context, mesh=placement.train_mesh)
    checkpointer = Checkpointer(
        checkpoint_uri(cfg, run_dir),
        max_to_keep=cfg.checkpoint.max_to_keep,
        async_save=cfg.checkpoint.async_save,
    )
    tracker = None
    engine = None
    replicas = None
    try:
        state = resume(checkpointer, learner, cfg)
        if learner.step:  # what was restored, for the recovery test and the operator
            restored = digest(flatten(learner.state))  # computed afresh, not copied
            resumed = {"step": learner.step, "version": state.version, "digest": restored}
            (out / RESUME_FILE).write_text(json.dumps(resumed) + "\n")
        if cfg.cluster.placement == "remote":
            engine, replicas = _remote_engine(cfg, run_dir, learner, source)
        else:
            engine = wiring.engine(
                learner.model(),
                placement=placement.engine_sharding,
                device_lock=placement.device_lock,
            )
        if state.version:
            engine.publish(learner.params_copy(), state.version)
        tracker = JsonlTracker(out / "metrics.jsonl")
        if cfg.tracing.tensorboard:
            tracker = Trackers(tracker, TensorBoardTracker(out / "tensorboard"))
        if hasattr(engine, "warmup"):
            engine.warmup()
        trace = out / TRACE_FILE
        if trace.exists():  # an earlier (perhaps killed) attempt's trace is kept, numbered
            n = len(list(out.glob("trace.*.perfetto-trace"))) + 1
            trace.rename(out / f"trace.{n}.perfetto-trace")
        tracer = (
            tracing.PerfettoTracer(trace, chunk_events=cfg.tracing.chunk_events)
            if cfg.tracing.enabled
            else tracing.NullTracer()
        )
        run = _Run(cfg, wiring, learner, engine, placement, tracker, checkpointer, state)
        with tracing.tracing(tracer):
            result = asyncio.run(run.main(start, out))
    finally:
        if engine is not None:
            engine.close()
        if replicas is not None:
            replicas.stop()
        if tracker is not None:
            tracker.close()
        checkpointer.close()
    hf.save(learner.model(), str(out / "model"))
    (out / RESULT_FILE).write_text(json.dumps(asdict(result), indent=2))
    return result


def _remote_engine(cfg: RunConfig, run_dir: Path, learner: Learner, init_model: str | None):
    """Rollout replicas in their own processes (loopback here; JobSet pods on GKE, whose
    addresses come in ASYNCRL_ROLLOUT_ADDRESSES as host:port,host:port)."""
    import os

    from flax import nnx

    from asyncrl.sampling.remote import RemoteEngine
    from asyncrl.stages.rollout_server import start_local_replicas

    def save_params(params, folder: Path) -> None:
        hf.save(nnx.merge(learner.graphdef, params, learner.rest), str(folder))

    given = os.environ.get("ASYNCRL_ROLLOUT_ADDRESSES")
    replicas = None
    if given:
        addresses = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in given.split(",")]
    else:
        config_file = run_dir / "train" / "rollout-config.yaml"
        config_file.write_text(to_yaml(cfg))
        replicas = start_local_replicas(
            config_file, cfg.cluster.rollout_replicas, init_model, run_dir / "train" / "replicas"
        )
        addresses = replicas.addresses
    return RemoteEngine(addresses, run_dir / "train" / "weights", save_params), replicas


def build_loop(
    cfg: RunConfig,
    wiring: Wiring,
    learner: Learner,
    engine,
    *,
    device_lock=None,
    tracker=None,
    hooks=(),
    admission: bool | None = None,
    state: PipelineState | None = None,
) -> TrainingLoop:
    """The queue, the staleness admission (async mode), the orchestrator and the training loop.

    `admission` False turns the admission bound off (tests use it to force stale groups). A
    restored `state` sets the policy version, the data cursor and the loop's counters.
    """
    state = state or PipelineState()
    g = cfg.rollout.group_size
    gps = cfg.learner.batch_size // g
    queue = GroupQueue(
        g,
        cfg.rollout.failure_policy,
        cfg.rollout.max_retries,
        max(cfg.rollout.max_ready_groups, gps),
    )
    wanted = cfg.learner.mode == "async" if admission is None else admission
    # One policy version covers `sync_every` steps' worth of groups.
    per_version = gps * cfg.learner.sync_every
    bound = StalenessAdmission(per_version, cfg.learner.max_staleness) if wanted else None
    if bound is not None:  # as if the trained groups had been admitted at their versions
        bound.version, bound.started = state.version, len(state.cursor.trained)
    settings = OrchestratorSettings(
        group_size=g,
        max_concurrency=cfg.rollout.max_concurrency,
        limits=wiring.limits(),
        sampling=wiring.sampling(),
        seed=cfg.seed,
    )
    orchestrator = Orchestrator(
        engine,
        queue,
        settings,
        make_env=wiring.make_env,
        make_agent=wiring.make_agent,
        admission=bound,
        cursor=state.cursor,
    )
    return TrainingLoop(
        learner,
        WeightPublisher(engine, version=state.version),
        orchestrator,
        queue,
        cfg.learner,
        groups_per_step=gps,
        admission=bound,
        device_lock=device_lock,
        tracker=tracker,
        hooks=hooks,
        cursor=state.cursor,
        stats=LoopStats.from_counters(state.counters),
    )


class _Run:
    """One training run's event-loop side: evaluation and checkpoint hooks around the loop."""

    def __init__(self, cfg, wiring, learner, engine, placement, tracker, checkpointer, state):
        self.cfg, self.wiring, self.learner, self.engine = cfg, wiring, learner, engine
        self.placement, self.tracker, self.checkpointer = placement, tracker, checkpointer
        self.state: PipelineState = state
        self.loop: TrainingLoop | None = None
        self.saved_step = learner.step  # restored (or initial) state: nothing new to save
        self.progress = Progress(cfg.learner.steps, "train")
        self.peak_rss = 0

    async def evaluate(self, step: int) -> None:
        with tracing.span("rollout", "held-out evaluation", {"step": step}):
            summary = await self.wiring.evaluate(self.engine, tag=f"eval{step}")
        row = {
            "solve_rate": summary.solve_rate,
            "mean_reward": summary.mean_reward,
            "episodes": summary.episodes,
            **{f"solve_rate/{f}": v for f, v in summary.by_family},
            **{f"status/{s}": n for s, n in summary.statuses},
        }
        self.state.evals.append({"step": step, **row})
        self.tracker.log(step, row, kind="eval")

    async def eval_hook(self, step: int, loop: TrainingLoop) -> None:
        every = self.cfg.learner.eval_every
        if every and step % every == 0:
            await self.evaluate(step)

    async def progress_hook(self, step: int, loop: TrainingLoop) -> None:
        m = loop.last_metrics
        self.progress.update(
            step,
            {
                "reward": f"{m.get('reward', 0):.3f}",
                "lag": f"{m.get('policy_lag_mean', 0):.2f}",
                "groups/min": f"{m.get('groups_per_min', 0):.0f}",
            },
        )

    async def checkpoint_hook(self, step: int, loop: TrainingLoop) -> None:
        every = self.cfg.checkpoint.every_steps
        if every and step % every == 0:
            self.save(loop)

    def save(self, loop: TrainingLoop) -> None:
        if self.saved_step == self.learner.step:
            return
        self.saved_step = self.learner.step
        loop.reconcile_failed()
        self.state.version = loop.version
        self.state.cursor = loop.cursor
        self.state.counters = loop.stats.counters()
        # A copy: the next train step donates the learner's buffers while Orbax still writes.
        with tracing.span("checkpointer", "checkpoint save", {"step": self.learner.step}):
            snapshot = jax.tree.map(jnp.copy, self.learner.state)
            self.checkpointer.save(snapshot, self.state.to_json(self.cfg))
        faults.point(faults.Phase.CHECKPOINT, self.learner.step)  # Orbax writing in background

    async def main(self, start: float, out: Path) -> TrainResult:
        cfg = self.cfg
        if not self.state.evals:
            await self.evaluate(self.learner.step)
        self.loop = loop = build_loop(
            cfg,
            self.wiring,
            self.learner,
            self.engine,
            device_lock=self.placement.device_lock,
            tracker=self.tracker,
            hooks=(self.eval_hook, self.checkpoint_hook, self.progress_hook),
            state=self.state,
        )
        stream = training_tasks(cfg)
        sampler = CounterSampler(
            self.engine, loop.orchestrator, loop.queue, cfg.tracing.counter_interval_s
        )
        sampling = asyncio.create_task(sampler.run())
        try:
            stats = await loop.run(
                loop.cursor.numbered(stream.at), cfg.learner.steps, cfg.learner.time_budget_s
            )
        finally:
            sampling.cancel()
        self.peak_rss = sampler.peak_rss
        if self.state.evals[-1]["step"] != self.learner.step:
            await self.evaluate(self.learner.step)
        self.save(loop)
        with tracing.span("checkpointer", "checkpoint finalize"):
            self.checkpointer.wait()
        self.progress.close()
        metrics = out / "metrics.jsonl"
        curve = learning_curve(metrics, out / "learning_curve.png")
        reward_curve(metrics, out / "reward_curve.png")
        queue_occupancy(metrics, out / "queue_occupancy.png")
        lag_histogram(collections.Counter(stats.lags), out / "policy_lag.png")
        lags = stats.lags or [0]
        evals = self.state.evals
        return TrainResult(
            model_dir=str(out / "model"),
            steps=self.learner.step,
            seconds=round(time.monotonic() - start, 2),
            initial_solve_rate=evals[0]["solve_rate"],
            final_solve_rate=evals[-1]["solve_rate"],
            groups_trained=stats.groups_trained,
            groups_dropped_stale=stats.groups_dropped_stale,
            policy_lag_mean=sum(lags) / len(lags),
            policy_lag_max=max(lags),
            learner_idle_fraction=stats.wait_seconds
            / max(stats.wait_seconds + stats.train_seconds, 1e-9),
            curve=str(curve),
        )
