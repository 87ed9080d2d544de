"""Configuration of the model and its tokenizer.

Owns the shape of a decoder-only Llama/Qwen2-family transformer as plain numbers (no JAX here), and
which tokenizer and chat format go with it. Named shape presets live in `presets.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config.errors import require
from asyncrl.config.ops import check_location
from asyncrl.config.presets import MODEL_PRESETS, selects_preset

Architecture = Literal["llama", "qwen2"]
DType = Literal["float32", "bfloat16"]
RopeScaling = Literal["none", "llama3"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    # Shape preset (config/presets.py) whose numbers fill the keys not given beside it; "custom"
    # starts from these defaults instead. Kept in the resolved config for information.
    preset: str = field(default="tiny", metadata=selects_preset(MODEL_PRESETS))
    # Which Hugging Face architecture the weights follow; decides tensor names on import/export.
    architecture: Architecture = "qwen2"
    # Rows of the embedding table; must cover every id the tokenizer can produce.
    vocab_size: int = 320
    # Width of the residual stream (D).
    d_model: int = 256
    # Number of decoder blocks.
    n_layers: int = 4
    # Query heads (N).
    n_heads: int = 4
    # Key/value heads (K); N must be a multiple of K (grouped-query attention).
    n_kv_heads: int = 2
    # Width of one head (H).
    head_dim: int = 64
    # Hidden width of the SwiGLU MLP.
    d_ff: int = 768
    # RoPE base frequency.
    rope_theta: float = 10000.0
    # RoPE frequency rescaling: "llama3" is the Llama-3.1/3.2 long-context scheme.
    rope_scaling: RopeScaling = "none"
    # llama3 rope scaling parameters (used only when rope_scaling is "llama3").
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    # Epsilon of RMSNorm.
    rms_eps: float = 1e-6
    # Bias on the q/k/v projections (Qwen2 has it, Llama does not).
    qkv_bias: bool = True
    # Output head shares the embedding matrix.
    tie_embeddings: bool = True
    # Longest sequence (prompt + all turns) the model and its KV cache accept.
    max_seq_len: int = 1024
    # Dtype of activations; float32 on CPU, bfloat16 on TPU.
    dtype: DType = "float32"
    # Dtype parameters are stored in.
    param_dtype: DType = "float32"
    # Hugging Face safetensors directory (local path or gs:// URI) to load; None = random init.
    checkpoint: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "d_ff",
        ):
            value = getattr(self, name)
            require(value > 0, name, value, "a positive integer")
        require(
            self.n_heads % self.n_kv_heads == 0,
            "n_kv_heads",
            self.n_kv_heads,
            f"a divisor of n_heads={self.n_heads}",
        )
        require(self.head_dim % 2 == 0, "head_dim", self.head_dim, "an even number (RoPE)")
        require(self.rope_theta > 0, "rope_theta", self.rope_theta, "a positive number")
        require(self.rms_eps > 0, "rms_eps", self.rms_eps, "a positive number")
        require(self.max_seq_len >= 8, "max_seq_len", self.max_seq_len, "an integer >= 8")
        require(self.rope_factor >= 1, "rope_factor", self.rope_factor, "a number >= 1")
        if self.checkpoint is not None:
            check_location("checkpoint", self.checkpoint)
        require(
            self.rope_high_freq_factor > self.rope_low_freq_factor,
            "rope_high_freq_factor",
            self.rope_high_freq_factor,
            f"a number > rope_low_freq_factor={self.rope_low_freq_factor}",
        )


TokenizerKind = Literal["byte", "hf"]
ChatFormatName = Literal["chatml", "llama3"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenizerConfig:
    # "byte": the built-in byte tokenizer for tiny models; "hf": a Hugging Face tokenizer.json.
    kind: TokenizerKind = "byte"
    # Directory or file (local or gs://) holding tokenizer.json; required when kind is "hf".
    path: str | None = None
    # How messages and tool calls are rendered into tokens (Qwen uses chatml, Llama 3 its own).
    chat_format: ChatFormatName = "chatml"

    def __post_init__(self) -> None:
        require(
            self.kind != "hf" or bool(self.path),
            "path",
            self.path,
            "a directory or tokenizer.json path when kind is 'hf'",
        )
        if self.path:
            check_location("path", self.path)
