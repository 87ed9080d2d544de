"""The Llama / Qwen2-family decoder (Flax NNX), its KV-cache layout, sharding and HF checkpoints."""

from asyncrl.model.cache import KVCache, init_cache
from asyncrl.model.transformer import Transformer, build_model, count_params

__all__ = ["KVCache", "Transformer", "build_model", "count_params", "init_cache"]
