"""The engine's two jitted device steps, as pure functions of (params, cache, inputs).

`prefill_step` runs one chunk of one request's prompt into its slot's cache rows and samples the
next token; `decode_step` advances every slot by one token. The cache and the presence mask
(tokens already in each row's sequence, for the repetition penalty) are donated; parameters never
are, because the engine may still hold them after a publish. Rows whose slot is idle decode at
position `max_len`, so their cache writes fall off the end and a parked session's cache survives.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from asyncrl.model.cache import KVCache
from asyncrl.sampling.strategies import NEG_INF, RowParams, sample


def _keys(base: jax.Array, counters: jax.Array) -> jax.Array:
    """Per-row keys: the request's own stream, advanced by how many tokens it has sampled."""
    wrapped = jax.random.wrap_key_data(base)
    return jax.vmap(jax.random.fold_in)(wrapped, counters)


def _mask_vocab(logits: jax.Array, vocab_limit: int) -> jax.Array:
    if vocab_limit >= logits.shape[-1]:
        return logits
    ids = jnp.arange(logits.shape[-1])
    return jnp.where(ids < vocab_limit, logits, NEG_INF)


@functools.partial(
    jax.jit, static_argnames=("graphdef", "window", "vocab_limit"), donate_argnums=(2, 3)
)
def prefill_step(
    graphdef: nnx.GraphDef,
    state: tuple[nnx.State, nnx.State],  # (parameters, other variables)
    cache: KVCache,  # [slots, K, S, H] per layer
    presence: jax.Array,  # [slots, V] bool
    slots: jax.Array,  # [P] int32: the cache row of each prefill row
    tokens: jax.Array,  # [P, T] int32: chunks padded to a bucket
    starts: jax.Array,  # [P] int32: position of tokens[:, 0]
    n_valid: jax.Array,  # [P] int32: real tokens per row (0 = row unused)
    reset: jax.Array,  # [P] bool: the chunk starts a new sequence (forget the row's presence)
    final: jax.Array,  # [P] bool: the chunk ends the prompt (its sampled token is kept)
    row_params: RowParams,  # [P] each
    base_keys: jax.Array,  # [P, 2] uint32
    counters: jax.Array,  # [P] int32
    *,
    window: int,
    vocab_limit: int,
):
    """Prefill P rows and sample each one's next token.

    With P equal to the number of slots the rows are the cache itself (row i is slot i, unused rows
    start at max_len so their writes are dropped); otherwise the P rows are gathered and scattered
    back. Sampling always takes the sorting path here: a prefill is rare next to decode steps.
    """
    model = nnx.merge(graphdef, *state)
    p, width = tokens.shape
    wide = p == cache.batch
    if wide:
        rows = cache
    else:
        rows = KVCache(k=tuple(c[slots] for c in cache.k), v=tuple(c[slots] for c in cache.v))
    positions = starts[:, None] + jnp.arange(width)[None]
    valid = jnp.arange(width)[None] < n_valid[:, None]
    logits, rows = model(tokens, positions, valid=valid, cache=rows, window=window)
    if wide:
        cache = rows
    else:
        cache = KVCache(
            k=tuple(c.at[slots].set(r) for c, r in zip(cache.k, rows.k, strict=True)),
            v=tuple(c.at[slots].set(r) for c, r in zip(cache.v, rows.v, strict=True)),
        )
    index = jnp.arange(p)
    last = _mask_vocab(logits[index, jnp.maximum(n_valid - 1, 0)], vocab_limit)
    seen = jnp.where(reset[:, None], False, presence[slots])
    seen = seen.at[index[:, None], tokens].max(valid)
    tok, logp, raw = sample(last, row_params, _keys(base_keys, counters), seen, sort=True)
    seen = seen.at[index, tok].max(final)
    used = n_valid > 0
    presence = presence.at[slots].set(jnp.where(used[:, None], seen, presence[slots]))
    return tok, logp, raw, cache, presence


@functools.partial(
    jax.jit, static_argnames=("graphdef", "window", "sort", "vocab_limit"), donate_argnums=(2, 3)
)
def decode_step(
    graphdef: nnx.GraphDef,
    state: tuple[nnx.State, nnx.State],
    cache: KVCache,
    presence: jax.Array,  # [B, V] bool
    tokens: jax.Array,  # [B] int32: each row's last sampled token
    positions: jax.Array,  # [B] int32: where that token goes (max_len for idle rows)
    active: jax.Array,  # [B] bool
    row_params: RowParams,  # [B] each
    base_keys: jax.Array,  # [B, 2] uint32
    counters: jax.Array,  # [B] int32
    *,
    window: int,
    sort: bool,
    vocab_limit: int,
):
    model = nnx.merge(graphdef, *state)
    logits, cache = model(tokens[:, None], positions[:, None], cache=cache, window=window)
    logits = _mask_vocab(logits[:, 0], vocab_limit)
    tok, logp, raw = sample(logits, row_params, _keys(base_keys, counters), presence, sort=sort)
    rows = jnp.arange(tokens.shape[0])
    presence = presence.at[rows, tok].set(presence[rows, tok] | active)
    return tok, logp, raw, cache, presence
