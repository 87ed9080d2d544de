"""The decoder-only transformer of the Llama / Qwen2 family as a Flax NNX module.

`Transformer(tokens, positions, valid, cache, window) -> (logits, cache)`: positions are explicit so
that continuous batching can run rows at different offsets; `cache` is a `KVCache` or None; logits
are float32. Architectural switches (QKV bias, tied embeddings, RoPE theta and scaling) come from
`ModelConfig`; the weights' names on disk are the business of `model/hf_checkpoint.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from asyncrl.config import ModelConfig
from asyncrl.model.attention import Attention
from asyncrl.model.cache import KVCache
from asyncrl.model.layers import MLP, RMSNorm, param, rope_inv_freq


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        pd = jnp.dtype(cfg.param_dtype)
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_eps, pd)
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.rms_eps, pd)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x, positions, inv_freq, valid, cache, window):
        h, cache = self.attn(self.attn_norm(x), positions, inv_freq, valid, cache, window)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), cache


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        pd = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = nnx.Param(
            jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.d_model), pd) * 0.02,
            logical_axes=("vocab", "embed"),
        )
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.n_layers)])
        self.final_norm = RMSNorm(cfg.d_model, cfg.rms_eps, pd)
        if not cfg.tie_embeddings:
            self.lm_head = param(rngs, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), pd)
        self.inv_freq = nnx.Variable(jnp.asarray(rope_inv_freq(cfg)))

    def __call__(
        self,
        tokens: jax.Array,  # [B, T] int32
        positions: jax.Array,  # [B, T] int32
        valid: jax.Array | None = None,  # [B, T] bool; None = all valid
        cache: KVCache | None = None,
        window: int | None = None,  # attend to cache slots [0, window); static
    ) -> tuple[jax.Array, KVCache | None]:  # logits [B, T, V] float32
        dt = jnp.dtype(self.cfg.dtype)
        x = self.embed[...].astype(dt)[tokens]
        if valid is None:
            valid = jnp.ones(tokens.shape, bool)
        inv_freq = self.inv_freq[...]
        new_k, new_v = [], []
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else (cache.k[i], cache.v[i])
            x, layer_cache = block(x, positions, inv_freq, valid, layer_cache, window)
            if layer_cache is not None:
                new_k.append(layer_cache[0])
                new_v.append(layer_cache[1])
        x = self.final_norm(x)
        head = self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]
        logits = jnp.dot(x.astype(jnp.float32), head.astype(jnp.float32))
        new_cache = None if cache is None else KVCache(k=tuple(new_k), v=tuple(new_v))
        return logits, new_cache


def build_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """A randomly initialised model; load real weights with `model.hf_checkpoint.load_into`."""
    return Transformer(cfg, nnx.Rngs(params=seed))


def count_params(model: Transformer) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
