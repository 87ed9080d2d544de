"""The jitted training steps: state in, state out (RL and supervised), with gradient accumulation.

The NNX model is split once into (graph, trainable params, other variables); a step merges them
inside `jax.jit` (one module-level jit per step kind, keyed by a hashable `StepConfig`: equal
configurations compile once per process), accumulates gradients over the batch's micro-batches
with `lax.scan` (each micro-batch's loss already carries the whole (mini-)batch's normaliser, so
the sum is the (mini-)batch gradient), clips, applies the Optax update and returns metrics. An RL
step makes one update per mini-batch (`minibatches`); the old policy of its ratios stays that of
the step's start. The state is donated; whoever needs the parameters after a step (the weight
publisher) takes a copy first.

Scoring matches the engine's sampling exactly: the log-softmax runs over the ids the engine can
sample (`vocab_limit`) of the logits divided by the rollout temperature, so an on-policy token's
ratio to its recorded log-prob is 1 up to float32 noise. (Top-k/top-p/min-p and the repetition
penalty are not reproduced: with those on, the off-policy correction absorbs the gap.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from asyncrl.learner.batching import TrainBatch
from asyncrl.learner.losses import LossInputs, LossSettings, policy_loss, sft_loss
from asyncrl.learner.optimizer import OptimizerSettings, make_optimizer

MICRO_FIELDS = ("inputs", "targets", "positions", "valid", "mask", "behaviour", "advantages")


@struct.dataclass
class TrainState:
    params: nnx.State
    opt_state: optax.OptState
    step: jax.Array  # [] int32: batches trained on (RL or SFT steps)


@struct.dataclass
class Scoring:
    """How logits become the sampled distribution: the engine's vocabulary and temperature."""

    vocab_limit: int | None = struct.field(pytree_node=False, default=None)
    temperature: float = struct.field(pytree_node=False, default=1.0)


def token_logprobs(
    graphdef, params, rest, inputs, positions, valid, targets, scoring: Scoring | None = None
):
    """log π(target) and the entropy of π at every position ([R, T] each).

    Targets at or beyond `vocab_limit` never occur where the loss mask is 1 (the engine cannot
    sample them; `Learner.batch_from_groups` checks); elsewhere they score as the last id.
    """
    scoring = scoring or Scoring()
    model = nnx.merge(graphdef, params, rest)
    logits, _ = model(inputs, positions, valid=valid)
    if scoring.vocab_limit is not None and scoring.vocab_limit < logits.shape[-1]:
        logits = logits[..., : scoring.vocab_limit]
        targets = jnp.minimum(targets, scoring.vocab_limit - 1)
    if scoring.temperature != 1.0:
        logits = logits / scoring.temperature
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
    entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
    return logp, entropy


def _accumulate(loss_of: Callable, params, micro: dict[str, jax.Array]):
    """Σ over micro-batches (the leading axis of every array in `micro`) of (loss, grads, sums)."""
    grad_fn = jax.value_and_grad(loss_of, has_aux=True)
    first = jax.tree.map(lambda a: a[0], micro)

    def body(carry, mb):
        loss, grads, sums = carry
        (micro_loss, aux), g = grad_fn(params, mb)
        grads = jax.tree.map(jnp.add, grads, g)
        sums = {
            k: jnp.maximum(sums[k], v) if k.endswith("_max") else sums[k] + v
            for k, v in aux.items()
        }
        return (loss + micro_loss, grads, sums), None

    _, aux0 = jax.eval_shape(lambda: loss_of(params, first))
    zeros = jax.tree.map(jnp.zeros_like, params)
    sums0 = {k: jnp.zeros(v.shape, v.dtype) for k, v in aux0.items()}
    (loss, grads, sums), _ = jax.lax.scan(body, (jnp.float32(0), zeros, sums0), micro)
    return loss, grads, sums


def _update(tx, params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _metrics(loss, grad_norm, lr, sums, n_tokens) -> dict[str, jax.Array]:
    metrics = {"loss": loss, "grad_norm": grad_norm, "lr": lr, "tokens": n_tokens}
    for k, v in sums.items():
        metrics[k.removesuffix("_sum")] = v if k.endswith("_max") else v / jnp.maximum(n_tokens, 1)
    return metrics


def _normalisers(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(B, N) of a (mini-)batch's mask [..., T], as `build_batch` counts them for the batch."""
    return jnp.maximum((mask.sum(-1) > 0).sum(), 1).astype(jnp.float32), mask.sum()


@dataclass(frozen=True, slots=True)
class StatePlacement:
    """Where a train state lives on its mesh (hashable: part of a `StepConfig`). A step places
    the state it returns like the one it was given; left to itself XLA would choose other
    shardings for some outputs (e.g. split a norm's Adam moments), and the second step would
    then compile again for inputs placed differently."""

    treedef: Any
    shardings: tuple

    @classmethod
    def of(cls, state: TrainState) -> StatePlacement:
        leaves, treedef = jax.tree.flatten(jax.tree.map(lambda x: x.sharding, state))
        return cls(treedef=treedef, shardings=tuple(leaves))

    def constrain(self, state: TrainState) -> TrainState:
        return jax.lax.with_sharding_constraint(
            state, jax.tree.unflatten(self.treedef, self.shardings)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepConfig:
    """Everything static about a step (hashable): equal configurations share one compilation,
    across Learner instances too."""

    graphdef: nnx.GraphDef
    optimizer: OptimizerSettings
    scoring: Scoring
    settings: LossSettings | None = None  # RL only
    minibatches: int = 1
    placement: StatePlacement | None = None  # None: one device, nothing to keep in place


def make_rl_step(c: StepConfig, rest):
    """`step(state, batch, ref_params) -> (state, metrics)`; `ref_params` may be None."""
    return functools.partial(_rl_step, rest=rest, c=c)


def make_sft_step(c: StepConfig, rest):
    """`step(state, batch) -> (state, metrics)`: next-token NLL on the batch's masked tokens."""
    return functools.partial(_sft_step, rest=rest, c=c)


def _score(c: StepConfig, params, rest, mb):
    args = (mb["inputs"], mb["positions"], mb["valid"], mb["targets"])
    return token_logprobs(c.graphdef, params, rest, *args, c.scoring)


@functools.partial(jax.jit, static_argnames="c")
def score_batch(params, rest, batch: TrainBatch, *, c: StepConfig) -> jax.Array:
    """log π of every target of the batch ([M, R, T]), as the steps score it."""
    micro = {f: getattr(batch, f) for f in ("inputs", "positions", "valid", "targets")}
    return jax.lax.map(lambda mb: _score(c, params, rest, mb)[0], micro)


@functools.partial(jax.jit, static_argnames="c", donate_argnums=0)
def _rl_step(state: TrainState, batch: TrainBatch, ref_params, *, rest, c: StepConfig):
    settings, k = c.settings, c.minibatches
    tx, schedule = make_optimizer(c.optimizer)
    recompute = settings.clip_against == "proximal" and k > 1

    def loss_of(params, mb):
        logp, entropy = _score(c, params, rest, mb)
        ref = (
            None
            if ref_params is None
            else jax.lax.stop_gradient(_score(c, ref_params, rest, mb)[0])
        )
        proximal = mb["proximal"] if recompute else jax.lax.stop_gradient(logp)
        x = LossInputs(
            logp=logp,
            behaviour=mb["behaviour"],
            mask=mb["mask"],
            advantages=mb["advantages"],
            n_sequences=mb["n_sequences"],
            n_tokens=mb["n_tokens"],
            proximal=proximal if settings.clip_against == "proximal" else None,
            ref_logp=ref,
        )
        loss, metrics = policy_loss(x, settings)
        metrics["entropy_sum"] = (jax.lax.stop_gradient(entropy) * mb["mask"]).sum()
        return loss, metrics

    micro = {f: getattr(batch, f) for f in MICRO_FIELDS}
    if recompute:  # π_prox: the parameters as the batch is consumed, before any update
        micro["proximal"] = jax.lax.map(lambda mb: _score(c, state.params, rest, mb)[0], micro)
    # [M, ...] -> [k, M/k, ...]: mini-batch j is the j-th run of M/k micro-batches.
    minis = jax.tree.map(lambda a: a.reshape(k, -1, *a.shape[1:]), micro)
    n_seq, n_tok = jax.vmap(_normalisers)(minis["mask"])
    per_mini = minis["mask"].shape[1]
    minis["n_sequences"] = jnp.repeat(n_seq[:, None], per_mini, axis=1)
    minis["n_tokens"] = jnp.repeat(n_tok[:, None], per_mini, axis=1)

    def one_update(carry, mini):
        params, opt_state = carry
        loss, grads, sums = _accumulate(loss_of, params, mini)
        params, opt_state = _update(tx, params, opt_state, grads)
        return (params, opt_state), (loss, optax.tree.norm(grads), sums)

    (params, opt_state), (losses, norms, sums) = jax.lax.scan(
        one_update, (state.params, state.opt_state), minis
    )
    sums = {key: v.max() if key.endswith("_max") else v.sum() for key, v in sums.items()}
    metrics = _metrics(losses.mean(), norms.mean(), schedule(state.step * k), sums, n_tok.sum())
    metrics["no_signal_share"] = batch.no_signal_share
    return _placed(c, TrainState(params=params, opt_state=opt_state, step=state.step + 1)), metrics


@functools.partial(jax.jit, static_argnames="c", donate_argnums=0)
def _sft_step(state: TrainState, batch: TrainBatch, *, rest, c: StepConfig):
    tx, schedule = make_optimizer(c.optimizer)

    def loss_of(params, mb):
        logp, _ = _score(c, params, rest, mb)
        correct = (logp > jnp.log(0.5)) * mb["mask"]
        return sft_loss(logp, mb["mask"], batch.n_tokens), {"confident_sum": correct.sum()}

    micro = {f: getattr(batch, f) for f in MICRO_FIELDS}
    loss, grads, sums = _accumulate(loss_of, state.params, micro)
    params, opt_state = _update(tx, state.params, state.opt_state, grads)
    metrics = _metrics(loss, optax.tree.norm(grads), schedule(state.step), sums, batch.n_tokens)
    return _placed(c, TrainState(params=params, opt_state=opt_state, step=state.step + 1)), metrics


def _placed(c: StepConfig, state: TrainState) -> TrainState:
    return state if c.placement is None else c.placement.constrain(state)


def init_state(params: nnx.State, tx: optax.GradientTransformation) -> TrainState:
    return TrainState(params=params, opt_state=tx.init(params), step=jnp.int32(0))
