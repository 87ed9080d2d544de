"""Configuration of the RL learner and the async training loop (the warm start: warm_start.py).

Owns the objective (loss family, clipping, KL, off-policy correction), the optimizer and schedule,
batching, and the loop's coordination knobs (mode, staleness bound, publish cadence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asyncrl.config.errors import require

Mode = Literal["sync", "async"]
LossName = Literal["grpo", "dr_grpo", "dapo", "gspo"]
AdvantageScaling = Literal["group", "batch", "none"]
KLEstimator = Literal["k1", "k3"]
OffPolicyCorrection = Literal["none", "tis", "mis"]
ClipAgainst = Literal["behaviour", "proximal"]
Schedule = Literal["constant", "cosine", "linear"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnerConfig:
    # "sync": collect the whole batch, then train (the baseline); "async": stream ready groups.
    mode: Mode = "async"
    # Policy-gradient objective (see learner/losses.py for each one's formula).
    loss: LossName = "grpo"
    # Trajectories per optimizer step; a multiple of rollout.group_size.
    batch_size: int = 32
    # Optimizer steps of RL training.
    steps: int = 100
    # Peak learning rate and its schedule.
    lr: float = 1e-5
    schedule: Schedule = "constant"
    warmup_steps: int = 0
    # AdamW parameters.
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    # Global-norm gradient clip (0 = off).
    grad_clip: float = 1.0
    # Tokens per micro-batch; rows are packed into micro-batches by Σ L² and gradients accumulated.
    micro_batch_tokens: int = 8192
    # Longest model-sampled part of a trajectory the learner accepts (tokens).
    max_response_length: int = 256
    # PPO-style clip range of the importance ratio (dapo: asymmetric).
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    # What the ratio is clipped against: "behaviour" = the rollout's recorded log-probs (PPO/GRPO
    # as published); "proximal" = decoupled PPO (AReaL), the learner's own policy recomputed when
    # the batch is consumed, with importance weights to the behaviour policy. With "proximal" the
    # clip only acts from a batch's second mini-batch on (see `minibatches`).
    clip_against: ClipAgainst = "behaviour"
    # Optimizer updates per batch: the batch is split into this many mini-batches, each one
    # update (the ratio's old policy stays that of the batch's start). 1 = one update per batch.
    minibatches: int = 1
    # Normalise every loss by the batch's sampled tokens (a token mean) instead of its own
    # normaliser (grpo: per-sequence means; dr_grpo: B·max_response_length; gspo: per sequence).
    # dapo always is token-level.
    token_level_norm: bool = False
    # Advantage normalisation: divide by the group's std, the batch's std, or not at all.
    advantage_scaling: AdvantageScaling = "group"
    # Weight of the KL penalty to a frozen reference policy, the model training starts from (the
    # warm start); 0 = none, and no reference copy is kept. 0.1 (k3): an audit of the demo (issue
    # 18) found it stops the entropy blow-up and format loss of lr 1e-4 without the KL; on the toy
    # bandit (tests/test_bandit.py, lr 1e-2) it holds entropy at 3.3 nats where none collapses to
    # 1.1, and still reaches 0.95 reward in 22 steps (none: 17; 0.05: 18; 0.3: not in 40).
    kl_coef: float = 0.1
    kl_estimator: KLEstimator = "k3"
    # Correction for the gap between the rollout policy and the learner's, with cap `is_cap`:
    # clip_against=behaviour: "tis" truncates the ratio at is_cap (dual-clip PPO), "mis" masks
    # tokens whose ratio exceeds it; clip_against=proximal: truncated or masked importance weight
    # to the behaviour policy; "none": neither (see learner/losses.py).
    off_policy_correction: OffPolicyCorrection = "tis"
    is_cap: float = 2.0
    # DAPO's overlong filtering: truncated episodes (token or turn limit) get loss mask 0; they
    # still count in their group's advantage baseline.
    mask_truncated: bool = False
    # DAPO dynamic sampling: a complete group whose members all got the same reward (no
    # advantage signal) is skipped and the loop waits for another, at most `max_skipped_groups`
    # times per step (beyond that such groups are trained on; they contribute no gradient).
    skip_no_signal_groups: bool = False
    max_skipped_groups: int = 64
    # How many policy versions old a trajectory's oldest token may be when trained on.
    max_staleness: int = 1
    # Publish weights to the engine every this many optimizer steps.
    sync_every: int = 1
    # Evaluate on the held-out split every this many steps (0 = only at the end).
    eval_every: int = 10
    # Seconds of training the run may use (0 = no limit; steps still bound it).
    time_budget_s: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "batch_size",
            "steps",
            "micro_batch_tokens",
            "max_response_length",
            "sync_every",
            "minibatches",
        ):
            value = getattr(self, name)
            require(value > 0, name, value, "a positive integer")
        for name in ("warmup_steps", "max_staleness", "eval_every", "max_skipped_groups"):
            value = getattr(self, name)
            require(value >= 0, name, value, "an integer >= 0")
        require(self.lr > 0, "lr", self.lr, "a number > 0")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0")
        require(0 <= self.beta1 < 1, "beta1", self.beta1, "a number in [0, 1)")
        require(0 <= self.beta2 < 1, "beta2", self.beta2, "a number in [0, 1)")
        require(self.grad_clip >= 0, "grad_clip", self.grad_clip, "a number >= 0 (0 = off)")
        require(0 < self.epsilon_low < 1, "epsilon_low", self.epsilon_low, "a number in (0, 1)")
        require(self.epsilon_high > 0, "epsilon_high", self.epsilon_high, "a number > 0")
        require(self.kl_coef >= 0, "kl_coef", self.kl_coef, "a number >= 0")
        require(self.is_cap >= 1, "is_cap", self.is_cap, "a number >= 1")
        require(
            self.minibatches <= self.batch_size,
            "minibatches",
            self.minibatches,
            f"at most learner.batch_size={self.batch_size} (every mini-batch needs a trajectory)",
        )
        require(self.time_budget_s >= 0, "time_budget_s", self.time_budget_s, "a number >= 0")
        require(
            self.warmup_steps <= self.steps,
            "warmup_steps",
            self.warmup_steps,
            f"at most learner.steps={self.steps}",
        )
