"""The Optax optimizer and learning-rate schedule from configuration (pure construction)."""

from __future__ import annotations

import optax

from asyncrl.config.learner import Schedule


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


def make_optimizer(
    lr: float,
    *,
    schedule: Schedule = "constant",
    warmup: int = 0,
    steps: int = 1,
    weight_decay: float = 0.0,
    beta1: float = 0.9,
    beta2: float = 0.999,
    grad_clip: float = 0.0,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    sched = make_schedule(lr, schedule, warmup, steps)
    adam = optax.adamw(sched, b1=beta1, b2=beta2, weight_decay=weight_decay)
    tx = optax.chain(optax.clip_by_global_norm(grad_clip), adam) if grad_clip > 0 else adam
    return tx, sched
