"""The small pieces of a Llama/Qwen2 block: RMSNorm, rotary embeddings, the SwiGLU MLP.

Every parameter carries `logical_axes` metadata (names such as "embed", "mlp") that
`model/sharding.py` maps to mesh axes; nothing here knows about meshes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from asyncrl.config import ModelConfig

INIT_STD = 0.02


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], dtype) -> nnx.Param:
    """A normally initialised parameter with its logical axis names."""
    value = INIT_STD * jax.random.normal(rngs.params(), shape, dtype)
    return nnx.Param(value, logical_axes=axes)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype) -> None:
        self.weight = nnx.Param(jnp.ones((dim,), dtype), logical_axes=("norm",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * self.weight[...].astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [H/2] in float32, with Llama-3 rescaling when configured."""
    h = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, h, 2, dtype=np.int64).astype(np.float32) / h))
    inv = inv.astype(np.float32)
    if cfg.rope_scaling == "llama3":
        old, lo, hi, factor = (
            cfg.rope_original_max_len,
            cfg.rope_low_freq_factor,
            cfg.rope_high_freq_factor,
            cfg.rope_factor,
        )
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    return inv


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate x [B, T, N, H] by its positions [B, T] (the rotate-half convention of HF Llama)."""
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, H]
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        pd = jnp.dtype(cfg.param_dtype)
        self.gate = param(rngs, (cfg.d_model, cfg.d_ff), ("embed", "mlp"), pd)
        self.up = param(rngs, (cfg.d_model, cfg.d_ff), ("embed", "mlp"), pd)
        self.down = param(rngs, (cfg.d_ff, cfg.d_model), ("mlp", "embed"), pd)

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = x.dtype
        g = x @ self.gate[...].astype(dt)
        u = x @ self.up[...].astype(dt)
        return (jax.nn.silu(g) * u) @ self.down[...].astype(dt)
