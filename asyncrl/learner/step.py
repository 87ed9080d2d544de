"""The jitted training steps: state in, state out (RL and supervised), with gradient accumulation.

The NNX model is split once into (graph, trainable params, other variables); a step merges them
inside `jax.jit`, accumulates gradients over the batch's micro-batches with `lax.scan` (each
micro-batch's loss already carries the whole batch's normaliser, so the sum is the full-batch
gradient), clips, applies the Optax update and returns metrics. The state is donated; whoever
needs the parameters after a step (the weight publisher) takes a copy first.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from asyncrl.learner.batching import TrainBatch
from asyncrl.learner.losses import LossInputs, LossSettings, policy_loss, sft_loss


@struct.dataclass
class TrainState:
    params: nnx.State
    opt_state: optax.OptState
    step: jax.Array  # [] int32: optimizer steps taken


def token_logprobs(graphdef, params, rest, inputs, positions, valid, targets):
    """log π(target) and the entropy of π at every position ([R, T] each)."""
    model = nnx.merge(graphdef, params, rest)
    logits, _ = model(inputs, positions, valid=valid)
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
    entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
    return logp, entropy


def _micro(batch: TrainBatch, i) -> dict[str, jax.Array]:
    fields = ("inputs", "targets", "positions", "valid", "mask", "behaviour", "advantages")
    return {f: getattr(batch, f)[i] for f in fields}


def _accumulate(loss_of: Callable, params, batch: TrainBatch):
    """Σ over micro-batches of (loss, grads, metric sums)."""
    grad_fn = jax.value_and_grad(loss_of, has_aux=True)

    def body(carry, i):
        loss, grads, sums = carry
        (micro_loss, aux), g = grad_fn(params, _micro(batch, i))
        grads = jax.tree.map(jnp.add, grads, g)
        sums = {k: sums[k] + aux[k] for k in sums} | {
            k: jnp.maximum(sums[k], aux[k]) for k in sums if k.endswith("_max")
        }
        return (loss + micro_loss, grads, sums), None

    _, aux0 = jax.eval_shape(lambda: loss_of(params, _micro(batch, 0)))
    zeros = jax.tree.map(jnp.zeros_like, params)
    sums0 = {k: jnp.zeros(v.shape, v.dtype) for k, v in aux0.items()}
    m = batch.inputs.shape[0]
    (loss, grads, sums), _ = jax.lax.scan(body, (jnp.float32(0), zeros, sums0), jnp.arange(m))
    return loss, grads, sums


def _apply(tx, schedule, state: TrainState, loss, grads, sums, n_tokens):
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "lr": schedule(state.step),
        "tokens": n_tokens,
    }
    for k, v in sums.items():
        metrics[k.removesuffix("_sum")] = v if k.endswith("_max") else v / jnp.maximum(n_tokens, 1)
    return TrainState(params=params, opt_state=opt_state, step=state.step + 1), metrics


def make_rl_step(graphdef, rest, tx, schedule, settings: LossSettings):
    """`step(state, batch, ref_params) -> (state, metrics)`; `ref_params` may be None."""

    def step(state: TrainState, batch: TrainBatch, ref_params):
        def loss_of(params, mb):
            logp, entropy = token_logprobs(
                graphdef, params, rest, mb["inputs"], mb["positions"], mb["valid"], mb["targets"]
            )
            ref = None
            if ref_params is not None:
                ref, _ = token_logprobs(
                    graphdef,
                    ref_params,
                    rest,
                    mb["inputs"],
                    mb["positions"],
                    mb["valid"],
                    mb["targets"],
                )
                ref = jax.lax.stop_gradient(ref)
            x = LossInputs(
                logp=logp,
                behaviour=mb["behaviour"],
                mask=mb["mask"],
                advantages=mb["advantages"],
                n_sequences=batch.n_sequences,
                n_tokens=batch.n_tokens,
                ref_logp=ref,
            )
            loss, metrics = policy_loss(x, settings)
            metrics["entropy_sum"] = (jax.lax.stop_gradient(entropy) * mb["mask"]).sum()
            return loss, metrics

        loss, grads, sums = _accumulate(loss_of, state.params, batch)
        return _apply(tx, schedule, state, loss, grads, sums, batch.n_tokens)

    return jax.jit(step, donate_argnums=0)


def make_sft_step(graphdef, rest, tx, schedule):
    """`step(state, batch) -> (state, metrics)`: next-token NLL on the batch's masked tokens."""

    def step(state: TrainState, batch: TrainBatch):
        def loss_of(params, mb):
            logp, _ = token_logprobs(
                graphdef, params, rest, mb["inputs"], mb["positions"], mb["valid"], mb["targets"]
            )
            correct = (logp > jnp.log(0.5)) * mb["mask"]
            return sft_loss(logp, mb["mask"], batch.n_tokens), {"confident_sum": correct.sum()}

        loss, grads, sums = _accumulate(loss_of, state.params, batch)
        return _apply(tx, schedule, state, loss, grads, sums, batch.n_tokens)

    return jax.jit(step, donate_argnums=0)


def init_state(params: nnx.State, tx: optax.GradientTransformation) -> TrainState:
    return TrainState(params=params, opt_state=tx.init(params), step=jnp.int32(0))
