"""A toy bandit: from a random micro model, each loss learns to answer from the rewarded half of
the vocabulary, on-policy (sync) and from samples one policy version old (async), with the default
learner settings otherwise (k3 KL to the initial weights included). Success is the sampling
policy's expected reward (its probability of a rewarded id, averaged over positions)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from asyncrl.learner.learner import Learner
from asyncrl.model import build_model
from asyncrl.testing.configs import micro_config
from asyncrl.types import Group, Trajectory

VOCAB = 272  # sampleable ids (the byte tokenizer's); the micro model has 320 rows
GOOD = VOCAB // 2  # a response token earns its share of the reward when its id is below this
PROMPTS = 8  # groups per step
GROUP = 4
PROMPT_LEN, RESPONSE_LEN = 4, 3
SEQ = 8  # the learner's row length: prompt and response fit
TARGET, MAX_STEPS = 0.95, 30


# Compiled once and run on tiny arrays: XLA's backend optimisations cost more than they save.
@functools.partial(
    jax.jit, static_argnames="graphdef", compiler_options={"xla_backend_optimization_level": 0}
)
def _sample(graphdef, params, rest, prompts, key):
    """Responses drawn token by token at temperature 1 over the sampleable ids.

    Returns (tokens [B, P+L], log-probs of the sampled tokens [B, L], the policy's probability of
    a good id at each response position [B, L]: its expected reward given the prefix).
    """
    model = nnx.merge(graphdef, params, rest)
    b = prompts.shape[0]
    seq = jnp.concatenate([prompts, jnp.zeros((b, RESPONSE_LEN), jnp.int32)], axis=1)
    positions = jnp.broadcast_to(jnp.arange(seq.shape[1]), seq.shape)
    logps, good = [], []
    for j in range(RESPONSE_LEN):
        logits, _ = model(seq, positions)
        logp_all = jax.nn.log_softmax(logits[:, PROMPT_LEN - 1 + j, :VOCAB], axis=-1)
        tok = jax.random.categorical(jax.random.fold_in(key, j), logp_all)
        seq = seq.at[:, PROMPT_LEN + j].set(tok)
        logps.append(jnp.take_along_axis(logp_all, tok[:, None], axis=-1)[:, 0])
        good.append(jnp.exp(logp_all[:, :GOOD]).sum(-1))
    return seq, jnp.stack(logps, 1), jnp.stack(good, 1)


def _groups(seq, logp, prompts_per_step, version) -> list[Group]:
    groups = []
    for g in range(prompts_per_step):
        members = []
        for i in range(GROUP):
            row = g * GROUP + i
            response = [int(x) for x in seq[row, PROMPT_LEN:]]
            members.append(
                Trajectory(
                    id=f"{g}.{i}",
                    group_id=f"g{g}",
                    task_id="bandit",
                    tokens=tuple(int(x) for x in seq[row]),
                    loss_mask=(0,) * PROMPT_LEN + (1,) * RESPONSE_LEN,
                    logprobs=(0.0,) * PROMPT_LEN + tuple(float(x) for x in logp[row]),
                    versions=(-1,) * PROMPT_LEN + (version,) * RESPONSE_LEN,
                    reward=float(np.mean([t < GOOD for t in response])),
                )
            )
        groups.append(
            Group(group_id=f"g{g}", number=g, task_id="bandit", trajectories=tuple(members))
        )
    return groups


# Each loss as the papers run it; dapo through decoupled PPO (AReaL): two updates per batch.
SETTINGS = {
    "grpo": ("behaviour", 1),
    "dr_grpo": ("behaviour", 1),
    "dapo": ("proximal", 2),
    "gspo": ("behaviour", 1),
}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("loss", list(SETTINGS))
def test_each_loss_solves_the_bandit_from_a_random_model(loss, mode):
    """sync: sample with the current weights, then one step. async: every batch was sampled by
    the weights of one version before the learner's (lag 1, as `max_staleness=1` allows), so the
    learner trains off-policy throughout; the reward counted is that of the lagged samples."""
    clip_against, minibatches = SETTINGS[loss]
    cfg = micro_config(
        f"learner.loss={loss}",
        f"learner.clip_against={clip_against}",
        f"learner.minibatches={minibatches}",
        f"learner.batch_size={PROMPTS * GROUP}",
        "learner.lr=1e-2",
    )
    lag = 1 if mode == "async" else 0
    learner = Learner(build_model(cfg.model, seed=0), cfg.learner, max_len=SEQ, vocab_limit=VOCAB)
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(np.repeat(rng.integers(1, VOCAB, (PROMPTS, PROMPT_LEN)), GROUP, 0))
    key = jax.random.key(0)
    versions = [learner.params_copy()]  # versions[v]: the weights after v steps
    expected, clip_fracs, lags = [], [], []
    for step in range(MAX_STEPS):
        sampler = max(step - lag, 0)  # the version that samples this step's batch
        seq, logp, good = _sample(
            learner.graphdef,
            versions[sampler],
            learner.rest,
            prompts,
            jax.random.fold_in(key, step),
        )
        expected.append(float(good.mean()))
        if expected[-1] >= TARGET:
            break
        groups = _groups(np.asarray(seq), np.asarray(logp), PROMPTS, sampler)
        metrics = learner.rl_step(learner.batch_from_groups(groups))
        clip_fracs.append(metrics["clip_frac"])
        lags.append(step - sampler)
        versions.append(learner.params_copy())
    assert expected[0] < 0.6, "the random model starts near chance"
    assert expected[-1] >= TARGET, (
        f"{loss}/{mode}: expected reward per step {np.round(expected, 3)}"
    )
    assert learner.step == len(clip_fracs) and metrics["lr"] == pytest.approx(1e-2)
    # The default objective keeps the initial weights and pays k3 KL to them on every step.
    assert cfg.learner.kl_coef > 0 and learner.reference is not None and metrics["kl"] > 0
    if mode == "async":  # off-policy by a version on every step after the first
        assert lags[0] == 0 and set(lags[1:]) == {1}
    if mode == "sync" and minibatches == 1:  # on-policy: the ratio to the behaviour policy is 1
        assert max(clip_fracs) == 0.0
    else:  # stale samples, or the second update of a batch: the trust region acts
        assert max(clip_fracs) > 0.0
