"""Stage: supervised warm start on expert demonstrations of the training tasks.

Gives the tiny model its starting skill (the tool-call format, reading tool output) so that RL
has something to improve. Trains `warm_start.steps` steps of `warm_start.batch_size`
demonstrations on the loss-masked assistant tokens, exports the model as HF safetensors to
`<run>/warm_start/model`, and records the held-out greedy solve rate it starts RL from.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import ClassVar

from asyncrl.config import RunConfig
from asyncrl.envs.demonstrations import demonstrations
from asyncrl.envs.tasks import task_stream
from asyncrl.learner.learner import Learner
from asyncrl.metrics.progress import Progress
from asyncrl.metrics.tracker import JsonlTracker
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf
from asyncrl.run_layout import RunLayout, Stage
from asyncrl.wiring.episodes import Wiring, evaluate_model


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmStartResult:
    STAGE: ClassVar[Stage] = Stage.WARM_START
    model_dir: str
    steps: int
    seconds: float
    final_loss: float
    heldout_solve_rate: float
    heldout_by_family: tuple[tuple[str, float], ...]
    demonstrations: int
    skipped_too_long: int  # demonstrations longer than env.max_context


def warm_start(cfg: RunConfig, layout: RunLayout, log_every: int = 20) -> WarmStartResult:
    start = time.monotonic()
    wiring = Wiring.of(cfg)
    model = build_model(cfg.model, seed=cfg.seed)
    if cfg.model.checkpoint:
        hf.load_into(model, cfg.model.checkpoint)
    tasks = list(task_stream(cfg.env.tasks, "train", cfg.env.train_size, cfg.env.seed))
    ws = cfg.warm_start
    mix = dict(
        tool_fraction=ws.tool_fraction,
        verbose_fraction=ws.verbose_fraction,
        privileged_fraction=ws.privileged_fraction,
    )
    every = demonstrations(tasks, wiring.fmt, **mix)
    demos = [d for d in every if len(d.tokens) <= cfg.env.max_context]
    if not demos:
        raise ValueError(f"no demonstration fits env.max_context={cfg.env.max_context}")
    fitting = [t for t, d in zip(tasks, every, strict=True) if len(d.tokens) <= cfg.env.max_context]
    content = demonstrations(fitting, wiring.fmt, content_only=True, **mix)
    learner = Learner(model, cfg.learner, max_len=cfg.env.max_context, sft=ws)
    tracker = JsonlTracker(layout.dir(Stage.WARM_START) / "metrics.jsonl")
    rng = random.Random(cfg.seed)
    loss = float("nan")
    rows = ws.batch_size
    progress = Progress(ws.steps, "warm start")
    for step in range(ws.steps):
        pool = content if step < ws.content_steps else demos
        batch = learner.sft_batch(rng.sample(pool, min(rows, len(pool))), rows=rows)
        metrics = learner.sft_step(batch)
        loss = metrics["loss"]
        if learner.step % log_every == 0 or learner.step == ws.steps:
            tracker.log(learner.step, metrics, kind="sft")
            progress.update(learner.step, {"loss": f"{loss:.3f}"})
    tracker.close()
    progress.close()
    trained = learner.model()
    model_dir = layout.warm_start_model
    hf.save(trained, str(model_dir))
    summary = evaluate_model(cfg, trained)
    result = WarmStartResult(
        model_dir=str(model_dir),
        steps=learner.step,
        seconds=round(time.monotonic() - start, 2),
        final_loss=loss,
        heldout_solve_rate=summary.solve_rate,
        heldout_by_family=summary.by_family,
        demonstrations=len(demos),
        skipped_too_long=len(every) - len(demos),
    )
    layout.write(result)
    return result
