"""Stage: asynchronous agentic GRPO, wired from the configuration.

Builds the placement (colocated or disaggregated devices), the learner on the train mesh, the
engine on the rollout devices, the publisher, the group queue, the orchestrator with its
staleness admission, and the training loop with an evaluation hook; runs it; writes the trained
model (HF safetensors), the metrics (JSONL) and the learning curve (PNG) under `<run>/train/`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from asyncrl.config import RunConfig
from asyncrl.envs.base import Task
from asyncrl.envs.tasks import task_stream
from asyncrl.learner.learner import Learner
from asyncrl.learner.loop import StalenessAdmission, TrainingLoop
from asyncrl.metrics.plots import learning_curve
from asyncrl.metrics.tracker import JsonlTracker
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf
from asyncrl.rollout.groups import GroupQueue
from asyncrl.rollout.orchestrator import Orchestrator, OrchestratorSettings
from asyncrl.stages.common import Wiring
from asyncrl.stages.runtime import make_placement
from asyncrl.sync.publisher import WeightPublisher

RESULT_FILE = "train.json"


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


def training_tasks(cfg: RunConfig) -> Iterator[Task]:
    """Epoch after epoch over the training split, each epoch in its own seeded order."""
    tasks = list(task_stream(cfg.env.tasks, "train", cfg.env.train_size, cfg.env.seed))
    for epoch in itertools.count():
        order = list(tasks)
        random.Random(f"{cfg.seed}/{epoch}").shuffle(order)
        yield from order


def train(cfg: RunConfig, run_dir: Path, init_model: str | None = None) -> TrainResult:
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
    engine = wiring.engine(
        learner.model(), placement=placement.engine_sharding, device_lock=placement.device_lock
    )
    tracker = JsonlTracker(out / "metrics.jsonl")
    try:
        engine.warmup()
        result = asyncio.run(_run(cfg, wiring, learner, engine, placement, tracker, start, out))
    finally:
        engine.close()
        tracker.close()
    hf.save(learner.model(), str(out / "model"))
    (out / RESULT_FILE).write_text(json.dumps(asdict(result), indent=2))
    return result


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
) -> TrainingLoop:
    """The queue, the staleness admission (async mode), the orchestrator and the training loop.

    `admission` False turns the admission bound off (tests use it to force stale groups).
    """
    g = cfg.rollout.group_size
    gps = cfg.learner.batch_size // g
    queue = GroupQueue(
        g,
        cfg.rollout.failure_policy,
        cfg.rollout.max_retries,
        max(cfg.rollout.max_ready_groups, gps),
    )
    wanted = cfg.learner.mode == "async" if admission is None else admission
    bound = StalenessAdmission(gps, cfg.learner.max_staleness) if wanted else None
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
    )
    return TrainingLoop(
        learner,
        WeightPublisher(engine),
        orchestrator,
        queue,
        cfg.learner,
        groups_per_step=gps,
        admission=bound,
        device_lock=device_lock,
        tracker=tracker,
        hooks=hooks,
    )


async def _run(cfg, wiring, learner, engine, placement, tracker, start, out) -> TrainResult:
    evals: list[float] = []

    async def evaluate(step: int) -> None:
        summary = await wiring.evaluate(engine, tag=f"eval{step}")
        evals.append(summary.solve_rate)
        tracker.log(
            step,
            {
                "solve_rate": summary.solve_rate,
                "mean_reward": summary.mean_reward,
                "episodes": summary.episodes,
                **{f"solve_rate/{f}": v for f, v in summary.by_family},
                **{f"status/{s}": n for s, n in summary.statuses},
            },
            kind="eval",
        )

    async def eval_hook(step: int, loop: TrainingLoop) -> None:
        if cfg.learner.eval_every and step % cfg.learner.eval_every == 0:
            await evaluate(step)

    await evaluate(0)
    loop = build_loop(
        cfg,
        wiring,
        learner,
        engine,
        device_lock=placement.device_lock,
        tracker=tracker,
        hooks=(eval_hook,),
    )
    stats = await loop.run(training_tasks(cfg), cfg.learner.steps, cfg.learner.time_budget_s)
    if not cfg.learner.eval_every or learner.step % cfg.learner.eval_every:
        await evaluate(learner.step)
    elapsed = time.monotonic() - start
    curve = learning_curve(out / "metrics.jsonl", out / "learning_curve.png")
    lags = stats.lags or [0]
    return TrainResult(
        model_dir=str(out / "model"),
        steps=stats.steps,
        seconds=round(elapsed, 2),
        initial_solve_rate=evals[0],
        final_solve_rate=evals[-1],
        groups_trained=stats.groups_trained,
        groups_dropped_stale=stats.groups_dropped_stale,
        policy_lag_mean=sum(lags) / len(lags),
        policy_lag_max=max(lags),
        learner_idle_fraction=stats.wait_seconds
        / max(stats.wait_seconds + stats.train_seconds, 1e-9),
        curve=str(curve),
    )
