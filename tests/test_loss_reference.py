"""Every loss against a plain-NumPy reference written from the papers, on random ragged batches.

The reference computes, in float64, the loss and its gradient with respect to each token's
log-probability ℓ by hand (no autodiff): GRPO (Shao et al. 2024), Dr. GRPO (Liu et al. 2025),
DAPO (Yu et al. 2025), GSPO (Zheng et al. 2025); the ratio against the behaviour policy (PPO,
with TIS as dual clip, Ye et al. 2020, and MIS as masking) or decoupled against a proximal
policy (Hilton et al. 2021, AReaL) with truncated/masked importance weights (Yao et al. 2025);
KL to a reference by k1 or k3 (Schulman 2020). The jitted learner must agree to REF_TOL.
"""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from asyncrl.learner.learner import Learner
from asyncrl.learner.losses import LossInputs, LossSettings, policy_loss
from asyncrl.learner.step import token_logprobs
from asyncrl.model import build_model
from asyncrl.testing.configs import micro_config
from asyncrl.types import Group, Trajectory

# float32 (learner) against float64 (reference), relative to the largest entry compared.
REF_TOL = 1e-5
EPS_LOW, EPS_HIGH, CAP, T_MAX = 0.2, 0.28, 2.0, 16
SEEDS = (0, 1, 2)


@dataclasses.dataclass
class Ragged:
    logp: np.ndarray  # [B, T] ℓ
    behaviour: np.ndarray  # [B, T] b
    proximal: np.ndarray  # [B, T] p
    ref: np.ndarray  # [B, T] ℓ_ref
    mask: np.ndarray  # [B, T]
    adv: np.ndarray  # [B]


def ragged(seed: int, rows: int = 8, width: int = 12) -> Ragged:
    """Rows of different lengths, a masked prompt, masked tool tokens inside, an empty row."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((rows, width))
    for i in range(rows - 1):
        start, end = rng.integers(0, 3), rng.integers(4, width + 1)
        mask[i, start:end] = 1
        mask[i, rng.integers(start, end)] = 0  # a tool token between sampled ones
    b = -rng.uniform(0.1, 4.0, (rows, width))
    # Token noise and a per-row shift: token and sequence ratios on every side of every bound.
    p = b + rng.normal(0, 0.5, b.shape) + rng.normal(0, 0.5, (rows, 1))
    logp = p + rng.normal(0, 0.5, b.shape) + rng.normal(0, 0.5, (rows, 1))
    return Ragged(
        logp=logp,
        behaviour=b,
        proximal=p,
        ref=logp + rng.normal(0, 0.3, b.shape),
        mask=mask,
        adv=rng.normal(0, 1, rows),
    )


def _clip(r):
    return np.clip(r, 1 - EPS_LOW, 1 + EPS_HIGH)


def _surrogate(r, adv, against, correction):
    """(s, ds/dlog r) of one ratio r = exp(log r) per element, before any importance weight."""
    r_free = np.minimum(r, CAP) if (against, correction) == ("behaviour", "tis") else r
    d_free = np.where(r_free < r, 0.0, r)  # d r_free / d log r
    d_clip = np.where((r > 1 - EPS_LOW) & (r < 1 + EPS_HIGH), r, 0.0)
    free, clipped = r_free * adv, _clip(r) * adv
    s = np.minimum(free, clipped)
    return s, np.where(free <= clipped, d_free, d_clip) * adv


def _weight_and_kept(r_old_to_behaviour, r_new_to_old, against, correction):
    """The importance weight w and the kept-mask k (zero or one) of each element."""
    if against == "behaviour":
        w = np.ones_like(r_new_to_old)
        over = r_new_to_old > CAP
    else:
        w = r_old_to_behaviour
        over = w > CAP
        w = np.minimum(w, CAP) if correction == "tis" else w
    kept = np.where(over, 0.0, 1.0) if correction == "mis" else np.ones_like(w)
    return w, kept


def reference(x: Ragged, name, against, correction, token_norm, kl=None):
    """(loss, dloss/dℓ [B, T]) of the module docstring's objective, in float64."""
    m, adv = x.mask, x.adv
    lengths = m.sum(1)
    n_seq, n_tok = max((lengths > 0).sum(), 1), m.sum()
    old = x.behaviour if against == "behaviour" else x.proximal
    if name == "gspo":  # sequence-level ratio: the geometric mean of the token ratios
        safe = np.maximum(lengths, 1)
        log_rho = ((x.logp - old) * m).sum(1) / safe
        log_w = ((old - x.behaviour) * m).sum(1) / safe
        rho = np.exp(log_rho)
        s, ds = _surrogate(rho, adv, against, correction)
        w, kept = _weight_and_kept(np.exp(log_w), rho, against, correction)
        seq_weight = (lengths / n_tok) if token_norm else np.full_like(lengths, 1 / n_seq)
        seq_weight = seq_weight * (lengths > 0)
        loss = -(seq_weight * kept * w * s).sum()
        grad = -(seq_weight * kept * w * ds / safe)[:, None] * m
    else:
        r = np.exp(x.logp - old)
        s, ds = _surrogate(r, adv[:, None], against, correction)
        w, kept = _weight_and_kept(np.exp(old - x.behaviour), r, against, correction)
        tok_weight = _token_weights(name, token_norm, m, n_seq, n_tok)
        loss = -(tok_weight * kept * w * s).sum()
        grad = -tok_weight * kept * w * ds
    if kl is not None:
        coef, estimator = kl
        delta = x.ref - x.logp
        value = -delta if estimator == "k1" else np.exp(delta) - delta - 1
        d_value = np.ones_like(delta) if estimator == "k1" else 1 - np.exp(delta)
        kl_weight = _token_weights("grpo" if name == "gspo" else name, token_norm, m, n_seq, n_tok)
        loss += coef * (kl_weight * value).sum()
        grad = grad + coef * kl_weight * d_value
    return loss, grad


def _token_weights(name, token_norm, m, n_seq, n_tok):
    """Each token's weight in the aggregate: the loss's normaliser, spread over its tokens."""
    if token_norm or name == "dapo":
        return m / n_tok
    if name == "dr_grpo":
        return m / (n_seq * T_MAX)
    return m / np.maximum(m.sum(1, keepdims=True), 1) / n_seq  # grpo


def _settings(name, against, correction, token_norm, kl=None):
    return LossSettings(
        name=name,
        epsilon_low=EPS_LOW,
        epsilon_high=EPS_HIGH,
        clip_against=against,
        correction=correction,
        is_cap=CAP,
        kl_coef=kl[0] if kl else 0.0,
        kl_estimator=kl[1] if kl else "k3",
        max_response_length=T_MAX,
        token_level_norm=token_norm,
    )


def _loss_and_grad(s: LossSettings, logp, behaviour, proximal, ref, mask, adv):
    """The learner's loss and its gradient in ℓ."""

    def loss_of(logp):
        inputs = LossInputs(
            logp=logp,
            behaviour=behaviour,
            mask=mask,
            advantages=adv,
            n_sequences=jnp.maximum((mask.sum(1) > 0).sum(), 1).astype(jnp.float32),
            n_tokens=mask.sum(),
            proximal=proximal,
            ref_logp=ref,
        )
        return policy_loss(inputs, s)[0]

    return jax.value_and_grad(loss_of)(logp)


LOSSES = ["grpo", "dr_grpo", "dapo", "gspo"]
CASES = list(itertools.product(LOSSES, ["behaviour", "proximal"], ["none", "tis", "mis"]))
KL_CASES = list(itertools.product(LOSSES, ["k1", "k3"]))
KL = 0.3


def _every_setting() -> tuple[LossSettings, ...]:
    plain = [_settings(*case, norm) for case in CASES for norm in (False, True)]
    kl = [
        _settings(name, "behaviour", "tis", norm, (KL, estimator))
        for name, estimator in KL_CASES
        for norm in (False, True)
    ]
    return (*plain, *kl)


# Test-local jits run a few times on small arrays: their compile time is what costs, so XLA's
# backend optimisations are off (about half the compile time here; the same HLO, so the same math).
QUICK = {"xla_backend_optimization_level": 0}


@functools.partial(jax.jit, static_argnums=0, compiler_options=QUICK)
def _all_losses(settings: tuple[LossSettings, ...], *arrays):
    # Every configuration in one compilation: one XLA module costs far less than 64 small ones.
    return [_loss_and_grad(s, *arrays) for s in settings]


@functools.cache
def _learner_losses(seed: int) -> dict[LossSettings, tuple[float, np.ndarray]]:
    """The jitted learner loss and gradient of every configuration on `ragged(seed)`."""
    x = ragged(seed)
    fields = ("logp", "behaviour", "proximal", "ref", "mask", "adv")
    settings = _every_setting()
    out = _all_losses(settings, *(jnp.asarray(getattr(x, f), jnp.float32) for f in fields))
    return {
        s: (float(loss), np.asarray(grad, np.float64))
        for s, (loss, grad) in zip(settings, out, strict=True)
    }


def _agree(expected, actual):
    scale = max(np.max(np.abs(expected)), 1e-3)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=REF_TOL * scale)


@pytest.mark.parametrize(("name", "against", "correction"), CASES)
def test_loss_and_gradient_match_the_reference(name, against, correction):
    for seed, token_norm in itertools.product(SEEDS, (False, True)):
        x = ragged(seed)
        loss, grad = _learner_losses(seed)[_settings(name, against, correction, token_norm)]
        ref_loss, ref_grad = reference(x, name, against, correction, token_norm)
        _agree(ref_loss, loss)
        _agree(ref_grad, grad)
        assert np.all(grad[x.mask == 0] == 0)


@pytest.mark.parametrize(("name", "estimator"), KL_CASES)
def test_kl_penalty_matches_the_reference(name, estimator):
    for seed, token_norm in itertools.product(SEEDS, (False, True)):
        x, kl = ragged(seed), (KL, estimator)
        loss, grad = _learner_losses(seed)[_settings(name, "behaviour", "tis", token_norm, kl)]
        ref_loss, ref_grad = reference(x, name, "behaviour", "tis", token_norm, kl)
        _agree(ref_loss, loss)
        _agree(ref_grad, grad)


def test_the_random_batches_reach_every_region():
    """Not vacuous: over SEEDS, token and sequence ratios and weights fall on every side of every
    bound (below, inside and above the clip range, and above the cap)."""
    xs = [ragged(seed) for seed in SEEDS]

    def values(v_of, sequence):
        out = []
        for x in xs:
            v, on = v_of(x), x.mask.sum(1) > 0
            if sequence:
                out.append(np.exp((v * x.mask).sum(1)[on] / x.mask.sum(1)[on]))
            else:
                out.append(np.exp(v[x.mask > 0]))
        return np.concatenate(out)

    for sequence in (False, True):
        for old in ("behaviour", "proximal"):
            r = values(lambda x, old=old: x.logp - getattr(x, old), sequence)
            assert (r < 1 - EPS_LOW).any() and (r > 1 + EPS_HIGH).any() and (r > CAP).any()
            assert ((r > 1 - EPS_LOW) & (r < 1 + EPS_HIGH)).any()
        assert (values(lambda x: x.proximal - x.behaviour, sequence) > CAP).any()


def _trajectory_groups(n=8, seed=0):
    """Two groups of ragged trajectories with off-policy behaviour log-probs."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n // 4):
        members = []
        for i in range(4):
            length = int(rng.integers(12, 40))
            mask = [0] * 6 + [int(rng.random() > 0.1) for _ in range(length - 6)]
            members.append(
                Trajectory(
                    id=f"{g}.{i}",
                    group_id=f"g{g}",
                    task_id="t",
                    tokens=tuple(int(x) for x in rng.integers(0, 270, length)),
                    loss_mask=tuple(mask),
                    logprobs=tuple(float(-rng.uniform(4, 7)) if m else 0.0 for m in mask),
                    versions=tuple(0 if m else -1 for m in mask),
                    reward=float(rng.integers(0, 3)),
                )
            )
        groups.append(Group(group_id=f"g{g}", number=g, task_id="t", trajectories=tuple(members)))
    return groups


def _step_learner():
    """The learner of the step-level tests (one configuration: one compilation for them all)."""
    cfg = micro_config(
        "learner.loss=grpo",
        f"learner.epsilon_low={EPS_LOW}",
        f"learner.epsilon_high={EPS_HIGH}",
        f"learner.is_cap={CAP}",
        "learner.kl_coef=0.3",
        "learner.lr=3e-2",
    )
    learner = Learner(build_model(cfg.model, seed=1), cfg.learner, max_len=64, vocab_limit=272)
    batch = learner.batch_from_groups(_trajectory_groups(), rows=3)
    assert batch.inputs.shape[0] == 3  # ragged rows over three micro-batches, one part-empty
    return learner, batch


def test_clip_acts_on_stale_groups():
    learner, batch = _step_learner()
    batch = batch.replace(behaviour=jnp.asarray(learner.score(batch)))  # sampled by version 0
    fresh = learner.rl_step(batch)
    assert fresh["clip_frac"] == 0.0 and fresh["is_capped"] == 0.0
    assert abs(fresh["is_ratio"] - 1) <= 1e-4 and fresh["kl"] == 0.0
    stale = learner.rl_step(batch)  # the same groups, now one version behind the learner
    assert stale["clip_frac"] > 0 and stale["kl_behaviour"] > fresh["kl_behaviour"]
    assert stale["kl"] > 0
    for key in ("entropy", "clip_frac", "kl", "kl_behaviour", "no_signal_share", "is_capped"):
        assert np.isfinite(stale[key])


def test_the_learner_step_matches_the_reference_over_micro_batches():
    learner, batch = _step_learner()
    learner.rl_step(batch)  # moves the policy away from the reference

    @functools.partial(jax.jit, compiler_options=QUICK)
    def chain_rule_norm(params, d_logp):  # ‖Σ_t ∂L/∂ℓ_t · ∂ℓ_t/∂θ‖
        def scored(p):
            def one(mb):
                return token_logprobs(learner.graphdef, p, learner.rest, *mb, learner.scoring)[0]

            return jax.lax.map(one, (batch.inputs, batch.positions, batch.valid, batch.targets))

        return optax.tree.norm(jax.grad(lambda p: (scored(p) * d_logp).sum())(params))

    logp = learner.score(batch)
    rows = int(np.prod(batch.mask.shape[:2]))

    def flat(a):
        return np.asarray(a, np.float64).reshape(rows, -1)

    x = Ragged(
        logp=flat(logp),
        behaviour=flat(batch.behaviour),
        proximal=flat(logp),
        ref=flat(learner.score(batch, learner.reference)),
        mask=flat(batch.mask),
        adv=np.asarray(batch.advantages, np.float64).reshape(rows),
    )
    ref_loss, ref_grad = reference(x, "grpo", "behaviour", "tis", False, (0.3, "k3"))
    norm = chain_rule_norm(learner.state.params, jnp.asarray(ref_grad.reshape(logp.shape)))
    metrics = learner.rl_step(batch)
    assert metrics["clip_frac"] > 0 and metrics["is_capped"] > 0 and metrics["kl"] > 0
    _agree(ref_loss, metrics["loss"])
    _agree(float(norm), metrics["grad_norm"])
