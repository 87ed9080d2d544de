"""Sampling strategies as pure functions: each filter keeps exactly what it should."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncrl.sampling.strategies import NEG_INF, RowParams, apply_repetition_penalty, sample


def _params(n=1, **kw):
    base = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
    base.update(kw)
    dtypes = {"top_k": jnp.int32}
    return RowParams(**{k: jnp.full((n,), v, dtypes.get(k, jnp.float32)) for k, v in base.items()})


LOGITS = jnp.log(jnp.asarray([[0.5, 0.25, 0.15, 0.07, 0.03]]))


def _support(params, draws=400, logits=LOGITS):
    keys = jax.random.split(jax.random.key(0), draws)
    presence = jnp.zeros((1, logits.shape[1]), bool)
    toks = jax.vmap(lambda k: sample(logits, params, k[None], presence, sort=True)[0][0])(keys)
    return set(np.asarray(toks).tolist())


@pytest.mark.parametrize(
    ("kw", "support"),
    [
        ({"top_k": 2}, {0, 1}),
        ({"top_p": 0.7}, {0, 1}),  # 0.5 < 0.7, and the token crossing 0.7 is kept
        ({"top_p": 0.5}, {0}),
        ({"min_p": 0.2}, {0, 1, 2}),  # keeps p >= 0.2 * 0.5
        ({"temperature": 0.0}, {0}),
        ({}, {0, 1, 2, 3, 4}),
    ],
)
def test_filters_keep_exactly_their_support(kw, support):
    assert _support(_params(**kw)) == support


def test_logprobs_are_of_the_sampled_distribution_and_raw_is_unfiltered():
    params = _params(top_k=2)
    tok, logp, raw = sample(
        LOGITS, params, jax.random.split(jax.random.key(3), 1), jnp.zeros((1, 5), bool), sort=True
    )
    t = int(tok[0])
    renorm = np.exp(np.asarray(LOGITS[0]))[:2] / np.exp(np.asarray(LOGITS[0]))[:2].sum()
    np.testing.assert_allclose(float(logp[0]), np.log(renorm[t]), rtol=1e-5)
    np.testing.assert_allclose(float(raw[0]), float(LOGITS[0, t]), rtol=1e-5)


def test_temperature_scales_the_sampled_logprob():
    tok, logp, _ = sample(
        LOGITS,
        _params(temperature=0.5),
        jax.random.split(jax.random.key(1), 1),
        jnp.zeros((1, 5), bool),
        sort=False,
    )
    expected = jax.nn.log_softmax(LOGITS[0] / 0.5)[int(tok[0])]
    np.testing.assert_allclose(float(logp[0]), float(expected), rtol=1e-5)


def test_repetition_penalty_follows_the_hf_convention():
    logits = jnp.asarray([[2.0, -2.0, 1.0]])
    presence = jnp.asarray([[True, True, False]])
    out = apply_repetition_penalty(logits, presence, jnp.asarray([2.0]))
    np.testing.assert_allclose(out, [[1.0, -4.0, 1.0]])


def test_rows_use_their_own_parameters_and_keys():
    logits = jnp.tile(LOGITS, (3, 1))
    params = RowParams(
        temperature=jnp.asarray([0.0, 1.0, 1.0]),
        top_k=jnp.asarray([0, 1, 0], jnp.int32),
        top_p=jnp.ones(3),
        min_p=jnp.zeros(3),
        repetition_penalty=jnp.ones(3),
    )
    tok, _, _ = sample(
        logits, params, jax.random.split(jax.random.key(0), 3), jnp.zeros((3, 5), bool), sort=True
    )
    assert tok[0] == 0 and tok[1] == 0


def test_filtered_tokens_are_never_drawn_even_at_high_temperature():
    params = _params(temperature=50.0, top_k=1)
    assert _support(params) == {0}
    assert float(NEG_INF) < -1e20
