"""The `Learner`: owns the trainable state on the train mesh and runs RL and SFT steps on it.

Effects live here (device placement, the donated state); the math lives in `step.py`,
`losses.py`, `advantages.py` and `batching.py`. `params_copy()` is what a publisher sends: a copy,
because the next step donates the state's buffers.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from asyncrl.checkpoint import faults
from asyncrl.config.learner import LearnerConfig
from asyncrl.learner.advantages import group_advantages
from asyncrl.learner.batching import TrainBatch, build_batch
from asyncrl.learner.losses import LossSettings
from asyncrl.learner.optimizer import make_optimizer
from asyncrl.learner.step import TrainState, init_state, make_rl_step, make_sft_step
from asyncrl.model import Transformer
from asyncrl.model.sharding import copy_state, shard_model
from asyncrl.types import Group, Trajectory


class Learner:
    def __init__(
        self,
        model: Transformer,
        cfg: LearnerConfig,
        *,
        max_len: int,
        mesh: Mesh | None = None,
        sft: bool = False,
    ) -> None:
        self.cfg, self.max_len, self.mesh = cfg, max_len, mesh
        if mesh is not None:
            shard_model(model, mesh)
        self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
        if sft:
            tx, self.schedule = make_optimizer(
                cfg.sft_lr,
                schedule="cosine",
                warmup=min(20, cfg.sft_steps // 10),
                steps=max(cfg.sft_steps, 1),
                grad_clip=1.0,
                beta1=cfg.beta1,
                beta2=cfg.beta2,
            )
        else:
            tx, self.schedule = make_optimizer(
                cfg.lr,
                schedule=cfg.schedule,
                warmup=cfg.warmup_steps,
                steps=cfg.steps,
                weight_decay=cfg.weight_decay,
                beta1=cfg.beta1,
                beta2=cfg.beta2,
                grad_clip=cfg.grad_clip,
            )
        self.state: TrainState = init_state(copy_state(params), tx)
        self.reference = copy_state(params) if cfg.kl_coef > 0 and not sft else None
        self._rl_step = make_rl_step(
            self.graphdef, self.rest, tx, self.schedule, LossSettings.of(cfg)
        )
        self._sft_step = make_sft_step(self.graphdef, self.rest, tx, self.schedule)

    @property
    def step(self) -> int:
        return int(self.state.step)

    def batch_from_groups(self, groups: Sequence[Group], rows: int | None = None) -> TrainBatch:
        trajectories = [t for g in groups for t in g.trajectories]
        rewards = [[t.reward for t in g.trajectories] for g in groups]
        advantages = np.concatenate(group_advantages(rewards, self.cfg.advantage_scaling))
        return build_batch(
            trajectories,
            advantages.tolist(),
            max_len=self.max_len,
            micro_batch_tokens=self.cfg.micro_batch_tokens,
            mask_truncated=self.cfg.mask_truncated,
            rows=rows,
        )

    def sft_batch(self, trajectories: Sequence[Trajectory], rows: int | None = None) -> TrainBatch:
        return build_batch(
            trajectories,
            [1.0] * len(trajectories),
            max_len=self.max_len,
            micro_batch_tokens=self.cfg.micro_batch_tokens,
            rows=rows,
        )

    def rl_step(self, batch: TrainBatch) -> dict[str, float]:
        self.state, metrics = self._rl_step(self.state, self._place(batch), self.reference)
        faults.point(faults.Phase.TRAIN, self.step)  # dispatched, not finished
        return {k: float(v) for k, v in metrics.items()}

    def sft_step(self, batch: TrainBatch) -> dict[str, float]:
        self.state, metrics = self._sft_step(self.state, self._place(batch))
        return {k: float(v) for k, v in metrics.items()}

    def params_copy(self) -> nnx.State:
        return copy_state(self.state.params)

    def model(self) -> Transformer:
        """A model with the current parameters (a copy: safe across later steps)."""
        return nnx.merge(self.graphdef, self.params_copy(), self.rest)

    def _place(self, batch: TrainBatch) -> TrainBatch:
        if self.mesh is None:
            return batch
        return jax.device_put(batch, NamedSharding(self.mesh, PartitionSpec()))
