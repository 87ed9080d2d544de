"""Policy-gradient losses of the GRPO family, as pure functions of per-token log-probabilities.

Notation, for sequence i and its sampled token t (mask m_it = 1):
    π_θ     the policy being trained;                     ℓ_it = log π_θ(y_it | ·)
    μ       the behaviour policy (the engine that sampled y_it);  b_it = its recorded log-prob
    π_prox  the proximal policy: the learner's own parameters when the batch is consumed
            (before its first update);                    p_it = log π_prox(y_it | ·)
    A_i     the group-relative advantage of sequence i (learner/advantages.py)
    |y_i|   sampled tokens of sequence i;  N = Σ_i |y_i|;  B = sequences;  sg = stop-gradient
    C       `is_cap`;   clip(r) = clip(r, 1 − ε_low, 1 + ε_high)
All three log-probs score the same distribution: logits of the ids the engine can sample
(`vocab_limit`), divided by the rollout temperature (learner/step.py), so on-policy r = 1.

Trust region (`clip_against`). The ratio r, the importance weight w and the kept-mask k per token:
    "behaviour"  (PPO / GRPO / DAPO as published, old policy = μ)
                 r = exp(ℓ − b), w = 1;  the clip bounds the step away from what was sampled.
    "proximal"   (decoupled PPO: Hilton et al. 2021; AReaL, Fu et al. 2025)
                 r = exp(ℓ − p), w = exp(p − b): the clip bounds each update against π_prox and
                 w corrects for μ ≠ π_prox. π_prox is recomputed at consumption; with
                 `minibatches` = 1 it equals π_θ at the only update, r ≡ 1 and the clip never acts.
Off-policy correction (`off_policy_correction`), applied to the quantity that carries μ:
    behaviour:  "none"  s = min(r·A, clip(r)·A)
                "tis"   s = min(min(r, C)·A, clip(r)·A)   (ratio truncated at C; for A < 0 this
                        is dual-clip PPO, Ye et al. 2020: no gradient where r > C)
                "mis"   k = 1[sg(r) ≤ C]                  (token masked out where r > C)
    proximal:   "none"  w as above;  "tis"  w = min(w, C)  (Yao et al. 2025);
                "mis"   w = w · 1[w ≤ C]  (AReaL's behaviour-weight cap)
    and always  s_it = k_it · w_it · min(r_it·A_i, clip(r_it)·A_i)  (with "tis" in behaviour mode
    the unclipped term uses min(r, C)).
    The gradient of s vanishes exactly where the clipped term is the smaller one:
    A > 0 and r > 1 + ε_high, or A < 0 and r < 1 − ε_low (plus, dual clip, A < 0 and r > C).

Aggregation per loss:
    grpo     L = −(1/B) Σ_i (1/|y_i|) Σ_t s_it                 (sequence mean of token means)
    dr_grpo  L = −(1/(B·T_max)) Σ_it s_it                      (Dr. GRPO: a constant normaliser,
                                                               T_max = learner.max_response_length)
    dapo     L = −(1/N) Σ_it s_it                              (token mean; asymmetric clip)
    gspo     L = −(1/B) Σ_i s_i with the sequence ratio ρ_i = exp((1/|y_i|) Σ_t (ℓ_it − o_it))
             in place of r (o = b or p), and the sequence weight exp((1/|y_i|) Σ_t (p_it − b_it))
             in place of w (proximal), each corrected as above at sequence level.
    `token_level_norm` replaces the normaliser by 1/N: grpo and dr_grpo become the token mean,
    gspo weights s_i by |y_i| (−(1/N) Σ_i |y_i| s_i); dapo always is.
KL to a frozen reference π_ref (the warm start; kl_coef > 0), per token, added with weight
kl_coef and aggregated like the loss (gspo: like grpo), not importance-weighted:
    k1 = ℓ − ℓ_ref;   k3 = exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1   (Schulman's estimator).

Diagnostics (per counted token): clip_frac, where the clip removes the gradient (the condition
above); is_capped, where r (behaviour) or w (proximal) exceeds C; is_ratio, exp(ℓ − b);
kl_behaviour = r − 1 − log r with r = exp(ℓ − b), the k3 estimate of KL(μ ‖ π_θ); kl, to π_ref.

Deviations from the papers: DAPO's dynamic sampling and overlong filtering act on the data, not
here (learner/loop.py skips groups without signal; `mask_truncated` zeroes truncated rows' mask);
DAPO's overlong reward shaping is not implemented. GSPO's paper clips at ε ≈ 3e-4 / 4e-4; here
the range is epsilon_low / epsilon_high as for every loss. Every normaliser (B, N) is that of the
whole (mini-)batch, passed in, so that gradient accumulation over micro-batches sums to exactly
the (mini-)batch gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from asyncrl.config.learner import LearnerConfig


@struct.dataclass
class LossInputs:
    logp: jax.Array  # [B, T] ℓ: log π_θ of each target token
    behaviour: jax.Array  # [B, T] b: engine log-probs
    mask: jax.Array  # [B, T] float, 1 on sampled tokens that count
    advantages: jax.Array  # [B]
    n_sequences: jax.Array  # [] sequences in the whole (mini-)batch (B)
    n_tokens: jax.Array  # [] counted tokens in the whole (mini-)batch (N)
    proximal: jax.Array | None = None  # [B, T] p, when clip_against = "proximal"
    ref_logp: jax.Array | None = None  # [B, T] ℓ_ref, when kl_coef > 0


@struct.dataclass
class LossSettings:
    name: str = struct.field(pytree_node=False)
    epsilon_low: float = struct.field(pytree_node=False)
    epsilon_high: float = struct.field(pytree_node=False)
    clip_against: str = struct.field(pytree_node=False)
    correction: str = struct.field(pytree_node=False)
    is_cap: float = struct.field(pytree_node=False)
    kl_coef: float = struct.field(pytree_node=False)
    kl_estimator: str = struct.field(pytree_node=False)
    max_response_length: int = struct.field(pytree_node=False)
    token_level_norm: bool = struct.field(pytree_node=False, default=False)

    @classmethod
    def of(cls, cfg: LearnerConfig) -> LossSettings:
        return cls(
            name=cfg.loss,
            epsilon_low=cfg.epsilon_low,
            epsilon_high=cfg.epsilon_high,
            clip_against=cfg.clip_against,
            correction=cfg.off_policy_correction,
            is_cap=cfg.is_cap,
            kl_coef=cfg.kl_coef,
            kl_estimator=cfg.kl_estimator,
            max_response_length=cfg.max_response_length,
            token_level_norm=cfg.token_level_norm,
        )


def _ratio_parts(logp, old, behaviour, s: LossSettings):
    """(r, unclipped-term ratio, w, kept) from log-probs of any shape, per the module docstring."""
    r = jnp.exp(logp - old)
    if s.clip_against == "behaviour":
        w = jnp.ones_like(r)
        capped = jax.lax.stop_gradient(r) > s.is_cap
        r_free = jnp.minimum(r, s.is_cap) if s.correction == "tis" else r
    else:
        w = jnp.exp(old - behaviour)
        capped = w > s.is_cap
        w = jnp.minimum(w, s.is_cap) if s.correction == "tis" else w
        r_free = r
    kept = jnp.where(capped, 0.0, 1.0) if s.correction == "mis" else jnp.ones_like(r)
    return r, r_free, jax.lax.stop_gradient(w), kept, capped


def _surrogate(r, r_free, adv, s: LossSettings):
    clipped = jnp.clip(r, 1 - s.epsilon_low, 1 + s.epsilon_high)
    return jnp.minimum(r_free * adv, clipped * adv)


def _clip_active(r, adv, s: LossSettings):
    """Where the clip takes the gradient away: the clipped term is strictly the smaller."""
    active = ((adv > 0) & (r > 1 + s.epsilon_high)) | ((adv < 0) & (r < 1 - s.epsilon_low))
    if s.clip_against == "behaviour" and s.correction == "tis":
        active = active | ((adv < 0) & (r > s.is_cap))  # the dual clip
    return active


def _aggregate(per_token: jax.Array, x: LossInputs, s: LossSettings) -> jax.Array:
    """The batch's share of Σ over tokens, with the loss's normaliser (a sum, not a mean)."""
    total = (per_token * x.mask).sum()
    if s.token_level_norm or s.name == "dapo":
        return total / jnp.maximum(x.n_tokens, 1.0)
    if s.name == "dr_grpo":
        return total / (x.n_sequences * s.max_response_length)
    lengths = jnp.maximum(x.mask.sum(-1), 1.0)
    return ((per_token * x.mask).sum(-1) / lengths).sum() / x.n_sequences


def _sequence_mean(v: jax.Array, mask: jax.Array) -> jax.Array:
    return (v * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)


def _token_objective(x: LossInputs, s: LossSettings, old: jax.Array):
    adv = x.advantages[:, None]
    r, r_free, w, kept, capped = _ratio_parts(x.logp, old, x.behaviour, s)
    objective = _aggregate(kept * w * _surrogate(r, r_free, adv, s), x, s)
    return objective, _clip_active(r, adv, s), capped


def _sequence_objective(x: LossInputs, s: LossSettings, old: jax.Array):
    """GSPO: the token quantities replaced by their sequence-level geometric means."""
    has = (x.mask.sum(-1) > 0).astype(jnp.float32)
    log_rho = _sequence_mean(x.logp - old, x.mask)
    log_w = _sequence_mean(old - x.behaviour, x.mask)
    # As token quantities with old = 0: r = exp(log ρ), w = exp(0 − (−log w)).
    r, r_free, w, kept, capped = _ratio_parts(log_rho, 0.0, -log_w, s)
    seq = kept * w * _surrogate(r, r_free, x.advantages, s) * has
    if s.token_level_norm:
        objective = (seq * x.mask.sum(-1)).sum() / jnp.maximum(x.n_tokens, 1.0)
    else:
        objective = seq.sum() / x.n_sequences
    return objective, _clip_active(r, x.advantages, s)[:, None], capped[:, None]


def kl_per_token(logp: jax.Array, ref_logp: jax.Array, estimator: str) -> jax.Array:
    delta = ref_logp - logp
    return -delta if estimator == "k1" else jnp.exp(delta) - delta - 1


def policy_loss(x: LossInputs, s: LossSettings) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss of this (micro-)batch and its diagnostics (sums over its tokens, for averaging)."""
    if s.clip_against == "proximal":
        if x.proximal is None:
            raise ValueError("clip_against='proximal' needs the proximal log-probs")
        old = jax.lax.stop_gradient(x.proximal)
    else:
        old = x.behaviour
    objective_of = _sequence_objective if s.name == "gspo" else _token_objective
    objective, clip_active, capped = objective_of(x, s, old)
    loss = -objective
    log_r = jax.lax.stop_gradient(x.logp) - x.behaviour  # log(π_θ / μ): how far from sampling
    r_behaviour = jnp.exp(log_r)
    metrics = {
        "clip_frac_sum": (clip_active * x.mask).sum(),
        "is_capped_sum": (capped * x.mask).sum(),
        "is_ratio_sum": (r_behaviour * x.mask).sum(),
        "is_ratio_max": jnp.max(jnp.where(x.mask > 0, r_behaviour, 0.0)),
        # k3 estimate of KL(μ ‖ π_θ) on the sampled tokens: the policy's drift from the rollout.
        "kl_behaviour_sum": ((r_behaviour - 1 - log_r) * x.mask).sum(),
    }
    if s.kl_coef > 0 and x.ref_logp is not None:
        kl = kl_per_token(x.logp, x.ref_logp, s.kl_estimator)
        kl_loss = _aggregate(kl, x, s if s.name != "gspo" else s.replace(name="grpo"))
        loss = loss + s.kl_coef * kl_loss
        metrics["kl_sum"] = (jax.lax.stop_gradient(kl) * x.mask).sum()
    return loss, metrics


def sft_loss(logp: jax.Array, mask: jax.Array, n_tokens: jax.Array) -> jax.Array:
    """Supervised warm start: token-mean negative log-likelihood of the masked tokens."""
    return -(logp * mask).sum() / jnp.maximum(n_tokens, 1.0)
