"""Named model shapes: the tiny CPU models and the real Llama/Qwen2-family checkpoints.

Values are the published Hugging Face `config.json` numbers, so a preset plus `model.checkpoint`
loads the real weights. Selecting `model.preset: NAME` in YAML starts from these numbers; keys given
beside it override them. A field opts into this with `metadata=selects_preset(TABLE)`: the loader
knows no section by name.
"""

from __future__ import annotations

from typing import Final

_QWEN2 = {"architecture": "qwen2", "qkv_bias": True, "rms_eps": 1e-6, "rope_theta": 1_000_000.0}
_LLAMA32 = {
    "architecture": "llama",
    "qkv_bias": False,
    "rms_eps": 1e-5,
    "rope_theta": 500_000.0,
    "rope_scaling": "llama3",
    "rope_factor": 32.0,
    "rope_low_freq_factor": 1.0,
    "rope_high_freq_factor": 4.0,
    "rope_original_max_len": 8192,
    "vocab_size": 128_256,
    "tie_embeddings": True,
}

MODEL_PRESETS: Final[dict[str, dict[str, object]]] = {
    # Unit tests: a fraction of a million parameters, compiles in seconds.
    "micro": {
        "architecture": "qwen2",
        "vocab_size": 320,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 16,
        "d_ff": 128,
        "max_seq_len": 256,
        "tie_embeddings": True,
        "qkv_bias": True,
    },
    # The CPU demo model of `configs/local.yaml`: 0.85M parameters, trains in minutes on 2 cores.
    "mini": {
        "architecture": "qwen2",
        "vocab_size": 320,
        "d_model": 128,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 32,
        "d_ff": 384,
        "max_seq_len": 1024,
        "tie_embeddings": True,
        "qkv_bias": True,
    },
    # A larger CPU model: about 3M parameters.
    "tiny": {
        "architecture": "qwen2",
        "vocab_size": 320,
        "d_model": 256,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 64,
        "d_ff": 768,
        "max_seq_len": 1024,
        "tie_embeddings": True,
        "qkv_bias": True,
    },
    # The ~30M model of the engine benchmark.
    "small": {
        "architecture": "qwen2",
        "vocab_size": 320,
        "d_model": 512,
        "n_layers": 8,
        "n_heads": 8,
        "n_kv_heads": 4,
        "head_dim": 64,
        "d_ff": 2048,
        "max_seq_len": 2048,
        "tie_embeddings": True,
        "qkv_bias": True,
    },
    "qwen2.5-0.5b": {
        **_QWEN2,
        "vocab_size": 151_936,
        "d_model": 896,
        "n_layers": 24,
        "n_heads": 14,
        "n_kv_heads": 2,
        "head_dim": 64,
        "d_ff": 4864,
        "tie_embeddings": True,
        "max_seq_len": 32_768,
    },
    "qwen2.5-1.5b": {
        **_QWEN2,
        "vocab_size": 151_936,
        "d_model": 1536,
        "n_layers": 28,
        "n_heads": 12,
        "n_kv_heads": 2,
        "head_dim": 128,
        "d_ff": 8960,
        "tie_embeddings": True,
        "max_seq_len": 32_768,
    },
    "qwen2.5-7b": {
        **_QWEN2,
        "vocab_size": 152_064,
        "d_model": 3584,
        "n_layers": 28,
        "n_heads": 28,
        "n_kv_heads": 4,
        "head_dim": 128,
        "d_ff": 18_944,
        "tie_embeddings": False,
        "max_seq_len": 32_768,
    },
    "llama-3.2-1b": {
        **_LLAMA32,
        "d_model": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "head_dim": 64,
        "d_ff": 8192,
        "max_seq_len": 131_072,
    },
    "llama-3.2-3b": {
        **_LLAMA32,
        "d_model": 3072,
        "n_layers": 28,
        "n_heads": 24,
        "n_kv_heads": 8,
        "head_dim": 128,
        "d_ff": 8192,
        "max_seq_len": 131_072,
    },
}

# Field metadata: a field whose value names an entry of a preset table. The loader fills the
# entry's values under the keys given beside it (keys given explicitly win); `custom` names "no
# preset: every key is given explicitly".
PRESETS_KEY = "asyncrl.config.presets"


def selects_preset(
    table: dict[str, dict[str, object]], custom: str = "custom"
) -> dict[str, tuple[dict[str, dict[str, object]], str]]:
    """Metadata for `field(default=..., metadata=selects_preset(MODEL_PRESETS))`."""
    return {PRESETS_KEY: (table, custom)}
