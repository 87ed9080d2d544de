"""Sampling strategies as pure, batched functions of logits: one row per request, own parameters.

`sample` applies, in order: repetition penalty (HF convention), temperature, top-k, top-p, min-p,
then draws from the resulting distribution with the row's own key. It returns the token, its
log-probability under the distribution actually sampled from, and its raw log-probability under the
unmodified model distribution. Importance-sampling corrections need to know which is which.
Temperature 0 is greedy; its "sampled-from" log-prob is taken at temperature 1 after filtering,
because a point mass has no useful log-probability.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

NEG_INF = -1e30


@struct.dataclass
class RowParams:
    """Per-row sampling parameters as device arrays, all shape [B]."""

    temperature: jax.Array  # float32; 0 = greedy
    top_k: jax.Array  # int32; 0 = off
    top_p: jax.Array  # float32; 1 = off
    min_p: jax.Array  # float32; 0 = off
    repetition_penalty: jax.Array  # float32; 1 = off


def apply_repetition_penalty(logits: jax.Array, presence: jax.Array, penalty: jax.Array):
    """logits [B, V]; presence [B, V] bool (token already in the sequence); penalty [B]."""
    p = penalty[:, None]
    penalised = jnp.where(logits > 0, logits / p, logits * p)
    return jnp.where(presence, penalised, logits)


def filter_logits(logits: jax.Array, params: RowParams, *, sort: bool) -> jax.Array:
    """Mask (to NEG_INF) tokens removed by top-k, top-p and min-p; `sort` enables the first two.

    `sort` is static: a batch where no row uses top-k/top-p skips the O(V log V) sort.
    """
    if sort:
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]  # descending
        vocab = logits.shape[-1]
        k = jnp.where(params.top_k > 0, jnp.minimum(params.top_k, vocab), vocab)
        kth = jnp.take_along_axis(sorted_logits, (k - 1)[:, None], axis=-1)
        logits = jnp.where(logits < kth, NEG_INF, logits)
        probs = jax.nn.softmax(jnp.where(sorted_logits < kth, NEG_INF, sorted_logits), axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it is kept).
        before = jnp.cumsum(probs, axis=-1) - probs
        keep_sorted = (before < params.top_p[:, None]) | (params.top_p[:, None] >= 1)
        cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, NEG_INF, logits)
    probs = jax.nn.softmax(logits, axis=-1)
    floor = params.min_p[:, None] * jnp.max(probs, axis=-1, keepdims=True)
    return jnp.where((probs < floor) & (params.min_p[:, None] > 0), NEG_INF, logits)


def sample(
    logits: jax.Array,  # [B, V] float32
    params: RowParams,
    keys: jax.Array,  # [B] typed PRNG keys, one per row
    presence: jax.Array,  # [B, V] bool
    *,
    sort: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(tokens [B] int32, sampled-from logprobs [B], raw logprobs [B])."""
    raw = jax.nn.log_softmax(logits, axis=-1)
    x = apply_repetition_penalty(logits, presence, params.repetition_penalty)
    greedy = params.temperature <= 0
    temp = jnp.where(greedy, 1.0, params.temperature)[:, None]
    x = filter_logits(x / temp, params, sort=sort)
    logp = jax.nn.log_softmax(x, axis=-1)
    drawn = jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, logp)
    tokens = jnp.where(greedy, jnp.argmax(x, axis=-1), drawn).astype(jnp.int32)
    pick = tokens[:, None]
    return (
        tokens,
        jnp.take_along_axis(logp, pick, axis=-1)[:, 0],
        jnp.take_along_axis(raw, pick, axis=-1)[:, 0],
    )
