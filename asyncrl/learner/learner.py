"""The `Learner`: owns the trainable state on the train mesh and runs RL and SFT steps on it.

Effects live here (device placement, the donated state); the math lives in `step.py`,
`losses.py`, `advantages.py` and `batching.py`. `params_copy()` is what a publisher sends: a copy,
because the next step donates the state's buffers.

On a trainer spanning several hosts every process holds a `Learner` on the global mesh; its
`lockstep` (`learner/lockstep.py`) announces each train step (with its batch) and each parameter
gather to the other processes before running it, and `params_copy()` brings the parameters whole
onto every host. Alone (the default), nothing is announced and nothing changes.

`vocab_limit` (the ids the engine may sample) and `temperature` (the rollout's) make the learner
score exactly the distribution the engine sampled from: give it the engine's values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from asyncrl.config.learner import LearnerConfig
from asyncrl.config.warm_start import WarmStartConfig
from asyncrl.learner.advantages import group_advantages, has_signal
from asyncrl.learner.batching import TrainBatch, build_batch
from asyncrl.learner.lockstep import Alone, Command, Lockstep, Op
from asyncrl.learner.losses import LossSettings
from asyncrl.learner.optimizer import OptimizerSettings, make_optimizer
from asyncrl.learner.step import (
    Scoring,
    StatePlacement,
    StepConfig,
    TrainState,
    init_state,
    make_rl_step,
    make_sft_step,
    score_batch,
)
from asyncrl.model import Transformer
from asyncrl.model.sharding import (
    batch_sharding,
    copy_state,
    data_parallel,
    onto_mesh,
    shard_model,
)
from asyncrl.types import Group, Trajectory


class Learner:
    def __init__(
        self,
        model: Transformer,
        cfg: LearnerConfig,
        *,
        max_len: int,
        mesh: Mesh | None = None,
        sft: WarmStartConfig | None = None,
        vocab_limit: int | None = None,
        temperature: float = 1.0,
        lockstep: Lockstep | None = None,
    ) -> None:
        """`vocab_limit`: the engine's (None = every row of the model); `temperature`: the
        rollout's (0 = greedy, whose recorded log-probs the engine takes at temperature 1);
        `lockstep`: how this process keeps step with the trainer's others (default: alone)."""
        self.cfg, self.max_len, self.mesh = cfg, max_len, mesh
        self.lockstep = lockstep or Alone()
        if vocab_limit is not None and not 0 < vocab_limit <= model.cfg.vocab_size:
            raise ValueError(f"vocab_limit={vocab_limit} is not in [1, {model.cfg.vocab_size}]")
        if temperature < 0:
            raise ValueError(f"temperature={temperature} is negative")
        self.vocab_limit = vocab_limit
        if mesh is not None:
            shard_model(model, mesh)
        self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
        self._rest_whole = self.lockstep.gather(self.rest)  # what `model()` merges (every host)
        if sft is not None:
            settings = OptimizerSettings.sft(sft)
        else:  # the schedule counts optimizer updates: `minibatches` per RL step
            k = cfg.minibatches
            rl = OptimizerSettings.rl(cfg)
            settings = dataclasses.replace(rl, steps=rl.steps * k, warmup_steps=rl.warmup_steps * k)
        tx, self.schedule = make_optimizer(settings)
        self.state: TrainState = init_state(copy_state(params), tx)
        self._rows_multiple = 1
        if mesh is not None:
            self.state = onto_mesh(self.state, mesh)
            self._rows_multiple = data_parallel(mesh)
        self.reference = copy_state(params) if cfg.kl_coef > 0 and sft is None else None
        self.scoring = Scoring(vocab_limit=vocab_limit, temperature=temperature or 1.0)
        placement = None if mesh is None else StatePlacement.of(self.state)
        rl_config = StepConfig(
            graphdef=self.graphdef,
            optimizer=settings,
            scoring=self.scoring,
            settings=LossSettings.of(cfg),
            minibatches=cfg.minibatches,
            placement=placement,
        )
        self._rl_step = make_rl_step(rl_config, self.rest)
        sft_config = StepConfig(
            graphdef=self.graphdef,
            optimizer=settings,
            scoring=Scoring(vocab_limit=vocab_limit),
            placement=placement,
        )
        self._sft_step = make_sft_step(sft_config, self.rest)
        self._score_config = rl_config

    @property
    def step(self) -> int:
        return int(self.state.step)

    def batch_from_groups(self, groups: Sequence[Group], rows: int | None = None) -> TrainBatch:
        trajectories = [t for g in groups for t in g.trajectories]
        self._check_sampleable(trajectories)
        rewards = [[t.reward for t in g.trajectories] for g in groups]
        advantages = np.concatenate(group_advantages(rewards, self.cfg.advantage_scaling))
        no_signal = sum(not has_signal(r) for r in rewards) / max(len(rewards), 1)
        return build_batch(
            trajectories,
            advantages.tolist(),
            max_len=self.max_len,
            micro_batch_tokens=self.cfg.micro_batch_tokens,
            mask_truncated=self.cfg.mask_truncated,
            rows=rows,
            minibatches=self.cfg.minibatches,
            no_signal_share=no_signal,
            row_multiple=self._rows_multiple,
        )

    def sft_batch(self, trajectories: Sequence[Trajectory], rows: int | None = None) -> TrainBatch:
        return build_batch(
            trajectories,
            [1.0] * len(trajectories),
            max_len=self.max_len,
            micro_batch_tokens=self.cfg.micro_batch_tokens,
            rows=rows,
            row_multiple=self._rows_multiple,
        )

    def rl_step(
        self, batch: TrainBatch, on_dispatch: Callable[[int], None] | None = None
    ) -> dict[str, float]:
        """One RL step; `on_dispatch(step)` runs once the step is dispatched, before it ends.

        Its metrics include entropy, clip_frac, kl (to the reference, when one is kept),
        kl_behaviour (to the rollout policy) and no_signal_share.
        """
        self.lockstep.announce(Command(op=Op.STEP, batch=batch))
        self.state, metrics = self._rl_step(self.state, self._place(batch), self.reference)
        if on_dispatch is not None:
            on_dispatch(self.step)
        return {k: float(v) for k, v in metrics.items()}

    def sft_step(self, batch: TrainBatch) -> dict[str, float]:
        self.state, metrics = self._sft_step(self.state, self._place(batch))
        return {k: float(v) for k, v in metrics.items()}

    def score(self, batch: TrainBatch, params: nnx.State | None = None) -> np.ndarray:
        """log π of every target of `batch` ([M, R, T]) as the RL step scores it, under the
        current parameters or `params` (e.g. `reference`); no update."""
        params = self.state.params if params is None else params
        placed = self._place(batch)
        return np.asarray(score_batch(params, self.rest, placed, c=self._score_config))

    def params_copy(self) -> nnx.State:
        """The parameters, whole on this host (gathered from every process when several)."""
        self.lockstep.announce(Command(op=Op.PARAMS))
        return self.lockstep.gather(self.state.params)

    def model(self) -> Transformer:
        """A model with the current parameters (a copy: safe across later steps)."""
        return nnx.merge(self.graphdef, self.params_copy(), self._rest_whole)

    def _check_sampleable(self, trajectories: Sequence[Trajectory]) -> None:
        """A sampled token the engine could not have sampled means mismatched vocabularies."""
        if self.vocab_limit is None:
            return
        for t in trajectories:
            bad = [
                x for x, m in zip(t.tokens, t.loss_mask, strict=True) if m and x >= self.vocab_limit
            ]
            if bad:
                raise ValueError(
                    f"trajectory {t.id} has sampled id {bad[0]} >= vocab_limit={self.vocab_limit}"
                )

    def _place(self, batch: TrainBatch) -> TrainBatch:
        """The batch on the mesh, its rows split over the data x fsdp devices (a batch whose rows
        do not divide evenly, e.g. built with an explicit `rows`, is replicated instead)."""
        if self.mesh is None:
            return batch
        if batch.inputs.shape[1] % self._rows_multiple:
            return jax.device_put(batch, NamedSharding(self.mesh, PartitionSpec()))
        return jax.device_put(
            batch, jax.tree.map(lambda a: batch_sharding(self.mesh, np.ndim(a)), batch)
        )
