"""Configuration of the supervised warm start: its optimizer and the demonstrations it learns from.

Owns every number the SFT stage uses (steps, learning rate and schedule, warmup, clipping, batch
size, the content-first phase) and the mix of teachers behind the demonstrations
(`envs/demonstrations.py`). Nothing here is shared with the RL learner's optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config.errors import require
from asyncrl.config.learner import Schedule


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmStartConfig:
    # Optimizer steps of supervised fine-tuning on demonstrations (0 = skip the warm start).
    steps: int = 200
    # Peak learning rate, its schedule and linear warmup (steps).
    lr: float = 1e-3
    schedule: Schedule = "cosine"
    warmup_steps: int = 0
    # Global-norm gradient clip (0 = off).
    grad_clip: float = 1.0
    # AdamW parameters.
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    # Demonstrations per step.
    batch_size: int = 32
    # The first this many steps train only on content tokens (tool argument values, answers);
    # see envs/demonstrations.py for why.
    content_steps: int = 0
    # Share of demonstrations that use the tools; the others answer at once with the unaided
    # teacher's guess (a warm start that uses tools only sometimes).
    tool_fraction: float = 1.0
    # Share of (tool-using) demonstrations whose final answer carries a remark ("391 (according to
    # the tools)") that the built-in tasks' exact-match verifier rejects: a verbose teacher. A
    # named experiment only: the default demo never plants a defect for RL to remove.
    verbose_fraction: float = 0.0
    # Share of (tool-using) demonstrations from a privileged teacher that sees the hidden state (a
    # lookup task's price table), looks up the first item only and knows the second price: correct
    # episodes that the student, which cannot see the table, can only imitate by inventing that
    # price (envs/demonstrations.py).
    privileged_fraction: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "warmup_steps", "content_steps"):
            value = getattr(self, name)
            require(value >= 0, name, value, "an integer >= 0")
        require(self.batch_size > 0, "batch_size", self.batch_size, "a positive integer")
        require(self.lr > 0, "lr", self.lr, "a number > 0")
        require(self.grad_clip >= 0, "grad_clip", self.grad_clip, "a number >= 0 (0 = off)")
        require(0 <= self.beta1 < 1, "beta1", self.beta1, "a number in [0, 1)")
        require(0 <= self.beta2 < 1, "beta2", self.beta2, "a number in [0, 1)")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0")
        for name in ("tool_fraction", "verbose_fraction", "privileged_fraction"):
            value = getattr(self, name)
            require(0 <= value <= 1, name, value, "a number in [0, 1]")
        require(
            self.content_steps <= self.steps,
            "content_steps",
            self.content_steps,
            f"an integer in [0, steps={self.steps}]",
        )
        require(
            self.warmup_steps <= self.steps,
            "warmup_steps",
            self.warmup_steps,
            f"at most steps={self.steps}",
        )
