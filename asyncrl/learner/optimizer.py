"""The Optax optimizer and learning-rate schedule from configuration (pure construction)."""

from __future__ import annotations

from dataclasses import dataclass

import optax

from asyncrl.config.learner import LearnerConfig, Schedule
from asyncrl.config.warm_start import WarmStartConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerSettings:
    """Every number of an AdamW optimizer with schedule and clipping, from one config section."""

    lr: float
    schedule: Schedule
    warmup_steps: int
    steps: int
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float

    @classmethod
    def rl(cls, cfg: LearnerConfig) -> OptimizerSettings:
        return cls(
            lr=cfg.lr,
            schedule=cfg.schedule,
            warmup_steps=cfg.warmup_steps,
            steps=cfg.steps,
            weight_decay=cfg.weight_decay,
            beta1=cfg.beta1,
            beta2=cfg.beta2,
            grad_clip=cfg.grad_clip,
        )

    @classmethod
    def sft(cls, cfg: WarmStartConfig) -> OptimizerSettings:
        return cls(
            lr=cfg.lr,
            schedule=cfg.schedule,
            warmup_steps=cfg.warmup_steps,
            steps=max(cfg.steps, 1),
            weight_decay=cfg.weight_decay,
            beta1=cfg.beta1,
            beta2=cfg.beta2,
            grad_clip=cfg.grad_clip,
        )


def make_schedule(lr: float, schedule: Schedule, warmup: int, steps: int) -> optax.Schedule:
    warm = optax.linear_schedule(0.0, lr, warmup) if warmup else None
    decay_steps = max(steps - warmup, 1)
    if schedule == "constant":
        main = optax.constant_schedule(lr)
    elif schedule == "cosine":
        main = optax.cosine_decay_schedule(lr, decay_steps)
    else:
        main = optax.linear_schedule(lr, 0.0, decay_steps)
    return optax.join_schedules([warm, main], [warmup]) if warm else main


def make_optimizer(s: OptimizerSettings) -> tuple[optax.GradientTransformation, optax.Schedule]:
    sched = make_schedule(s.lr, s.schedule, s.warmup_steps, s.steps)
    adam = optax.adamw(sched, b1=s.beta1, b2=s.beta2, weight_decay=s.weight_decay)
    tx = optax.chain(optax.clip_by_global_norm(s.grad_clip), adam) if s.grad_clip > 0 else adam
    return tx, sched
