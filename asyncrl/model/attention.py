"""Grouped-query self-attention with rotary positions and an optional KV cache.

Without a cache, keys are the call's own tokens and a key is visible to a query when it is valid and
its position is not later. With a cache, the call's keys are first written into the cache at their
positions and the query attends to cache slots 0..window-1 whose slot index is not later than its
own position (see model/cache.py for why that suffices).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from asyncrl.config import ModelConfig
from asyncrl.model import cache as kv
from asyncrl.model.layers import apply_rope, param


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        pd = jnp.dtype(cfg.param_dtype)
        d, n, k, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q = param(rngs, (d, n, h), ("embed", "heads", "head_dim"), pd)
        self.k = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pd)
        self.v = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pd)
        self.o = param(rngs, (n, h, d), ("heads", "head_dim", "embed"), pd)
        if cfg.qkv_bias:
            self.q_bias = nnx.Param(jnp.zeros((n, h), pd), logical_axes=("heads", "head_dim"))
            self.k_bias = nnx.Param(jnp.zeros((k, h), pd), logical_axes=("kv_heads", "head_dim"))
            self.v_bias = nnx.Param(jnp.zeros((k, h), pd), logical_axes=("kv_heads", "head_dim"))
        self.qkv_bias = cfg.qkv_bias
        self.n_rep = n // k
        self.scale = h**-0.5

    def _project(self, x: jax.Array, w: nnx.Param, bias_name: str) -> jax.Array:
        out = jnp.einsum("btd,dnh->btnh", x, w[...].astype(x.dtype))
        if self.qkv_bias:
            out = out + getattr(self, bias_name)[...].astype(x.dtype)
        return out

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        positions: jax.Array,  # [B, T]
        inv_freq: jax.Array,  # [H/2]
        valid: jax.Array,  # [B, T] bool: real tokens (False for padding)
        cache: tuple[jax.Array, jax.Array] | None,  # per layer ([B, K, S, H], [B, K, S, H])
        window: int | None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        q = apply_rope(self._project(x, self.q, "q_bias"), positions, inv_freq)  # [B, T, N, H]
        k = apply_rope(self._project(x, self.k, "k_bias"), positions, inv_freq)  # [B, T, K, H]
        v = self._project(x, self.v, "v_bias")  # [B, T, K, H]
        if cache is None:
            keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, H]
            visible = valid[:, None, :] & (positions[:, None, :] <= positions[:, :, None])
            new_cache = None
        else:
            # Padding is written too but lands beyond every real query position of its row.
            ck = kv.write(cache[0], k, positions)
            cv = kv.write(cache[1], v, positions)
            new_cache = (ck, cv)
            span = ck.shape[2] if window is None else window
            keys, values = ck[:, :, :span], cv[:, :, :span]
            slots = jnp.arange(span)
            visible = slots[None, None, :] <= positions[:, :, None]  # [B, T, S]
        out = _attend(q, keys.astype(q.dtype), values.astype(q.dtype), visible, self.scale)
        return jnp.einsum("btnh,nhd->btd", out, self.o[...].astype(x.dtype)), new_cache


def _attend(q, keys, values, visible, scale):
    """q [B, T, N, H]; keys, values [B, K, S, H]; visible [B, T, S] -> [B, T, N, H].

    Decoding (T = 1) drops the time axis from the contractions: XLA CPU's dot emitter is 1.5-3.5x
    slower with a unit dimension in the batch of small matmuls.
    """
    b, t, n, h = q.shape
    kh = keys.shape[1]
    neg = jnp.finfo(jnp.float32).min
    if t == 1:
        qg = q.reshape(b, kh, n // kh, h)  # [B, K, R, H]
        scores = jnp.einsum("bkrh,bksh->bkrs", qg, keys).astype(jnp.float32) * scale
        scores = jnp.where(visible[:, None, :, :], scores, neg)  # visible [B, 1, S]
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        return jnp.einsum("bkrs,bksh->bkrh", probs, values).reshape(b, 1, n, h)
    qg = q.reshape(b, t, kh, n // kh, h)  # [B, T, K, R, H]
    scores = jnp.einsum("btkrh,bksh->bkrts", qg, keys).astype(jnp.float32) * scale
    scores = jnp.where(visible[:, None, None, :, :], scores, neg)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bkrts,bksh->btkrh", probs, values).reshape(b, t, n, h)
