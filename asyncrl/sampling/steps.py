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
    jax.jit, static_argnames=("graphdef", "sort", "vocab_limit"), donate_argnums=(2, 3)
)
def prefill_step(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    cache: KVCache,  # [slots, K, S, H] per layer
    presence: jax.Array,  # [slots, V] bool
    slot: jax.Array,  # [] int32
    tokens: jax.Array,  # [1, T] int32 (chunk padded to a bucket)
    start: jax.Array,  # [] int32: position of tokens[0, 0]
    n_valid: jax.Array,  # [] int32: real tokens in the chunk
    presence_row: jax.Array,  # [V] bool: tokens of the whole prompt
    row_params: RowParams,  # [1] each
    base_key: jax.Array,  # [1, 2] uint32
    counter: jax.Array,  # [1] int32
    *,
    sort: bool,
    vocab_limit: int,
):
    model = nnx.merge(graphdef, state)
    take = functools.partial(jax.lax.dynamic_slice_in_dim, start_index=slot, slice_size=1, axis=0)
    row = KVCache(k=tuple(take(c) for c in cache.k), v=tuple(take(c) for c in cache.v))
    width = tokens.shape[1]
    positions = start + jnp.arange(width)[None]
    valid = jnp.arange(width)[None] < n_valid
    logits, row = model(tokens, positions, valid=valid, cache=row)
    put = functools.partial(jax.lax.dynamic_update_slice_in_dim, start_index=slot, axis=0)
    cache = KVCache(
        k=tuple(put(c, r) for c, r in zip(cache.k, row.k, strict=True)),
        v=tuple(put(c, r) for c, r in zip(cache.v, row.v, strict=True)),
    )
    last = jax.lax.dynamic_index_in_dim(logits[0], n_valid - 1, axis=0, keepdims=True)
    last = _mask_vocab(last, vocab_limit)
    tok, logp, raw = sample(
        last, row_params, _keys(base_key, counter), presence_row[None], sort=sort
    )
    presence = presence.at[slot].set(presence_row.at[tok[0]].set(True))
    return tok[0], logp[0], raw[0], cache, presence


@functools.partial(
    jax.jit, static_argnames=("graphdef", "window", "sort", "vocab_limit"), donate_argnums=(2, 3)
)
def decode_step(
    graphdef: nnx.GraphDef,
    state: nnx.State,
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
    model = nnx.merge(graphdef, state)
    logits, cache = model(tokens[:, None], positions[:, None], cache=cache, window=window)
    logits = _mask_vocab(logits[:, 0], vocab_limit)
    tok, logp, raw = sample(logits, row_params, _keys(base_keys, counters), presence, sort=sort)
    rows = jnp.arange(tokens.shape[0])
    presence = presence.at[rows, tok].set(presence[rows, tok] | active)
    return tok, logp, raw, cache, presence
