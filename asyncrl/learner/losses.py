"""Policy-gradient losses of the GRPO family, as pure functions of per-token log-probabilities.

Notation, for sequence i and its sampled token t (mask m_it = 1):
    π_θ     the policy being trained;           ℓ_it = log π_θ(y_it | ·)
    μ       the behaviour policy: the rollout engine that sampled y_it; b_it = its log-prob
    A_i     the group-relative advantage of sequence i (learner/advantages.py)
    |y_i|   the number of sampled tokens of sequence i;  N = Σ_i |y_i|;  B = number of sequences

Token surrogate (PPO clipping, asymmetric range ε_low / ε_high):
    s_it(r) = min(r · A_i, clip(r, 1 − ε_low, 1 + ε_high) · A_i)

Off-policy correction (`off_policy_correction`), since μ lags π_θ by up to max_staleness versions
and differs from it numerically even at zero lag (engine vs trainer kernels):
    "none"  r = exp(ℓ − b): clip against the behaviour policy itself (GRPO / PPO as published).
    "tis"   decoupled PPO: r = exp(ℓ − sg(ℓ)) (the proximal policy is the learner's own, before the
            step) and each token is weighted by w = min(exp(sg(ℓ) − b), C), the truncated importance
            ratio of learner to behaviour (Yao et al. 2025, "truncated importance sampling").
    "mis"   as "tis", but a token with exp(sg(ℓ) − b) > C is masked out instead (w = 0).
    sg is stop-gradient; C is `is_cap`.

Aggregation per loss:
    grpo     L = −(1/B) Σ_i (1/|y_i|) Σ_t w_it s_it               (sequence mean of token means)
    dr_grpo  L = −(1/(B·T_max)) Σ_i Σ_t w_it s_it                  (Dr. GRPO: a constant length
                                                                    normaliser, T_max =
                                                                    learner.max_response_length)
    dapo     L = −(1/N) Σ_it w_it s_it                            (token mean; asymmetric clip)
    gspo     L = −(1/B) Σ_i min(ρ_i A_i, clip(ρ_i, 1−ε_low, 1+ε_high) A_i),
             ρ_i = exp((1/|y_i|) Σ_t (ℓ_it − b_it))                (sequence-level ratio)
KL to a frozen reference π_ref (when kl_coef > 0), per token, aggregated like the loss (gspo:
like grpo):  k1 = ℓ − ℓ_ref;   k3 = exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1  (Schulman's estimator).

Deviations from the papers: DAPO's dynamic sampling and overlong reward shaping are not part of
the loss (zero-advantage groups simply contribute nothing); GSPO uses the behaviour log-probs as
its "old" policy, and its off-policy correction is the clipping itself (tis/mis are not applied).
Every normaliser (B, N) is passed in for the whole batch, so that gradient accumulation over
micro-batches sums to exactly the full-batch gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from asyncrl.config.learner import LearnerConfig


@struct.dataclass
class LossInputs:
    logp: jax.Array  # [B, T] log π_θ of each target token
    behaviour: jax.Array  # [B, T] engine log-probs (b)
    mask: jax.Array  # [B, T] float, 1 on sampled tokens
    advantages: jax.Array  # [B]
    n_sequences: jax.Array  # [] sequences in the whole batch (B)
    n_tokens: jax.Array  # [] sampled tokens in the whole batch (N)
    ref_logp: jax.Array | None = None  # [B, T] reference log-probs, when kl_coef > 0


@struct.dataclass
class LossSettings:
    name: str = struct.field(pytree_node=False)
    epsilon_low: float = struct.field(pytree_node=False)
    epsilon_high: float = struct.field(pytree_node=False)
    correction: str = struct.field(pytree_node=False)
    is_cap: float = struct.field(pytree_node=False)
    kl_coef: float = struct.field(pytree_node=False)
    kl_estimator: str = struct.field(pytree_node=False)
    max_response_length: int = struct.field(pytree_node=False)

    @classmethod
    def of(cls, cfg: LearnerConfig) -> LossSettings:
        return cls(
            name=cfg.loss,
            epsilon_low=cfg.epsilon_low,
            epsilon_high=cfg.epsilon_high,
            correction=cfg.off_policy_correction,
            is_cap=cfg.is_cap,
            kl_coef=cfg.kl_coef,
            kl_estimator=cfg.kl_estimator,
            max_response_length=cfg.max_response_length,
        )


def _surrogate(ratio, adv, lo, hi):
    return jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - lo, 1 + hi) * adv)


def _aggregate(per_token: jax.Array, x: LossInputs, s: LossSettings) -> jax.Array:
    """Sum of the batch's share of Σ over tokens, with the loss's normaliser (a sum, not a mean)."""
    lengths = jnp.maximum(x.mask.sum(-1), 1.0)
    if s.name in ("grpo", "gspo"):
        return ((per_token * x.mask).sum(-1) / lengths).sum() / x.n_sequences
    if s.name == "dr_grpo":
        return (per_token * x.mask).sum() / (x.n_sequences * s.max_response_length)
    return (per_token * x.mask).sum() / jnp.maximum(x.n_tokens, 1.0)  # dapo


def policy_loss(x: LossInputs, s: LossSettings) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss of this (micro-)batch and its diagnostics (sums over its tokens, for averaging)."""
    adv = x.advantages[:, None]
    log_w = jax.lax.stop_gradient(x.logp) - x.behaviour  # log(π_θ / μ) per token
    if s.name == "gspo":
        lengths = jnp.maximum(x.mask.sum(-1), 1.0)
        seq_ratio = jnp.exp(((x.logp - x.behaviour) * x.mask).sum(-1) / lengths)
        surrogate = _surrogate(seq_ratio, x.advantages, s.epsilon_low, s.epsilon_high)
        loss = -surrogate.sum() / x.n_sequences
        clipped = (
            jnp.abs(seq_ratio - 1) > jnp.where(x.advantages >= 0, s.epsilon_high, s.epsilon_low)
        )[:, None] * x.mask
        ratio = jnp.broadcast_to(seq_ratio[:, None], x.mask.shape)
    else:
        if s.correction == "none":
            ratio, weight = jnp.exp(x.logp - x.behaviour), jnp.ones_like(x.logp)
        else:
            ratio = jnp.exp(x.logp - jax.lax.stop_gradient(x.logp))
            w = jnp.exp(log_w)
            weight = (
                jnp.minimum(w, s.is_cap)
                if s.correction == "tis"
                else jnp.where(w > s.is_cap, 0.0, w)
            )
        per_token = weight * _surrogate(ratio, adv, s.epsilon_low, s.epsilon_high)
        loss = -_aggregate(per_token, x, s)
        unclipped = (ratio >= 1 - s.epsilon_low) & (ratio <= 1 + s.epsilon_high)
        clipped = (~unclipped).astype(jnp.float32) * x.mask
    metrics = {
        "clip_frac_sum": clipped.sum(),
        "is_ratio_sum": (jnp.exp(log_w) * x.mask).sum(),
        "is_ratio_max": jnp.max(jnp.where(x.mask > 0, jnp.exp(log_w), 0.0)),
        "is_masked_sum": ((jnp.exp(log_w) > s.is_cap) * x.mask).sum(),
    }
    if s.kl_coef > 0 and x.ref_logp is not None:
        delta = x.ref_logp - x.logp
        kl = -delta if s.kl_estimator == "k1" else jnp.exp(delta) - delta - 1
        kl_loss = _aggregate(kl, x, s if s.name != "gspo" else s.replace(name="grpo"))
        loss = loss + s.kl_coef * kl_loss
        metrics["kl_sum"] = (kl * x.mask).sum()
    return loss, metrics


def sft_loss(logp: jax.Array, mask: jax.Array, n_tokens: jax.Array) -> jax.Array:
    """Supervised warm start: token-mean negative log-likelihood of the masked tokens."""
    return -(logp * mask).sum() / jnp.maximum(n_tokens, 1.0)
