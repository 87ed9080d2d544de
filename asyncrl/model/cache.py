"""The KV-cache layout the model reads and writes: one key and one value array per layer.

Layout is [B, K, S, H] (batch, kv heads, sequence, head dim): on XLA CPU it decodes several times
faster than [B, S, K, H] because each head's keys are contiguous. The model writes new keys at the
tokens' positions and attends to slots 0..window-1; a row's entries must be written contiguously
from position 0, which is what makes stale entries of a reused slot invisible (they sit at
positions beyond the query). Allocation per engine slot, donation and slot bookkeeping belong to
`asyncrl.sampling`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from asyncrl.config import ModelConfig


@struct.dataclass
class KVCache:
    k: tuple[jax.Array, ...]  # per layer [B, K, S, H]
    v: tuple[jax.Array, ...]  # per layer [B, K, S, H]

    @property
    def length(self) -> int:
        return self.k[0].shape[2]

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]


def init_cache(
    cfg: ModelConfig, batch: int, length: int, dtype: jnp.dtype | None = None
) -> KVCache:
    """A zeroed cache for `batch` rows of up to `length` positions."""
    dtype = dtype or jnp.dtype(cfg.dtype)
    shape = (batch, cfg.n_kv_heads, length, cfg.head_dim)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers))
    return KVCache(k=zeros, v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)))


def write(cache_layer: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
    """Scatter `new` [B, T, K, H] into `cache_layer` [B, K, S, H] at `positions` [B, T].

    Positions past the cache end are dropped (padding of a prefill bucket may run past it).
    """

    def one_row(row: jax.Array, vals: jax.Array, pos: jax.Array) -> jax.Array:
        return row.at[:, pos, :].set(vals.transpose(1, 0, 2).astype(row.dtype), mode="drop")

    return jax.vmap(one_row)(cache_layer, new, positions)
