"""Hugging Face safetensors checkpoints of Llama and Qwen2 models, in and out of the NNX model.

Owns the mapping between HF tensor names/layouts and our parameters: HF linear weights are
[out, in]; ours are [in, heads, head_dim] (q/k/v) and [heads, head_dim, out] (o). Reads a single
`model.safetensors` or a sharded set with `model.safetensors.index.json`, from a local directory or
a gs:// URI; writes the same, with a `config.json` that `transformers` reads. Every missing,
unexpected or mis-shaped tensor is reported by name with expected and found shapes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import safetensors.numpy
from flax import nnx

from asyncrl import storage
from asyncrl.config import ModelConfig
from asyncrl.model.transformer import Transformer

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class CheckpointMismatch(ValueError):
    """The checkpoint's tensors do not fit the model; the message lists every problem."""


def _layout(cfg: ModelConfig) -> Iterator[tuple[str, tuple[str, ...], tuple[int, ...]]]:
    """(HF name, path of our parameter, HF shape) for every tensor of the architecture."""
    d, n, k, h, f, v = (
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.d_ff,
        cfg.vocab_size,
    )
    yield "model.embed_tokens.weight", ("embed",), (v, d)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        b = ("blocks", str(i))
        yield p + "input_layernorm.weight", (*b, "attn_norm", "weight"), (d,)
        yield p + "post_attention_layernorm.weight", (*b, "mlp_norm", "weight"), (d,)
        for name, heads in (("q", n), ("k", k), ("v", k)):
            yield p + f"self_attn.{name}_proj.weight", (*b, "attn", name), (heads * h, d)
            if cfg.qkv_bias:
                yield p + f"self_attn.{name}_proj.bias", (*b, "attn", f"{name}_bias"), (heads * h,)
        yield p + "self_attn.o_proj.weight", (*b, "attn", "o"), (d, n * h)
        yield p + "mlp.gate_proj.weight", (*b, "mlp", "gate"), (f, d)
        yield p + "mlp.up_proj.weight", (*b, "mlp", "up"), (f, d)
        yield p + "mlp.down_proj.weight", (*b, "mlp", "down"), (d, f)
    yield "model.norm.weight", ("final_norm", "weight"), (d,)
    if not cfg.tie_embeddings:
        yield "lm_head.weight", ("lm_head",), (v, d)


def _to_ours(hf_name: str, x: np.ndarray, ours_shape: tuple[int, ...]) -> np.ndarray:
    if hf_name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return x.T.reshape(ours_shape)  # [H*N, D] -> [D, N, H]
    if hf_name.endswith("o_proj.weight"):
        return x.T.reshape(ours_shape)  # [D, N*H] -> [N, H, D]
    if hf_name.endswith("_proj.bias"):
        return x.reshape(ours_shape)
    if hf_name.startswith("lm_head") or ".mlp." in hf_name:
        return x.T  # [out, in] -> [in, out]
    return x


def _to_hf(hf_name: str, x: np.ndarray, hf_shape: tuple[int, ...]) -> np.ndarray:
    if hf_name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return x.reshape(x.shape[0], -1).T  # [D, N, H] -> [N*H, D]
    if hf_name.endswith("o_proj.weight"):
        return x.reshape(-1, x.shape[-1]).T  # [N, H, D] -> [D, N*H]
    if hf_name.endswith("_proj.bias"):
        return x.reshape(hf_shape)
    if hf_name.startswith("lm_head") or ".mlp." in hf_name:
        return x.T
    return x


def _variable(model: Transformer, path: tuple[str, ...]) -> nnx.Variable:
    node: object = model
    for part in path:
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    assert isinstance(node, nnx.Variable)
    return node


def read_tensors(uri: str) -> dict[str, np.ndarray]:
    """All tensors of a safetensors checkpoint directory (single file or sharded with an index)."""
    names = set(storage.list_names(uri))
    if INDEX in names:
        index = json.loads(storage.read_bytes(storage.join(uri, INDEX)))
        files = sorted(set(index["weight_map"].values()))
    elif SINGLE in names:
        files = [SINGLE]
    else:
        raise FileNotFoundError(f"{uri} holds neither {SINGLE} nor {INDEX}")
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        tensors.update(safetensors.numpy.load(storage.read_bytes(storage.join(uri, name))))
    return tensors


def load_into(model: Transformer, uri: str) -> None:
    """Replace the model's parameters with the checkpoint's, cast to the model's param dtype."""
    cfg = model.cfg
    tensors = read_tensors(uri)
    expected = {name: (path, shape) for name, path, shape in _layout(cfg)}
    problems = [
        f"missing tensor {n} (expected shape {s})"
        for n, (_, s) in expected.items()
        if n not in tensors
    ]
    # Tied models are often saved with a redundant lm_head: ignored; anything else is an error.
    ignorable = {"lm_head.weight"} if cfg.tie_embeddings else set()
    problems += [
        f"unexpected tensor {n} {tuple(tensors[n].shape)}"
        for n in tensors
        if n not in expected and n not in ignorable and "rotary_emb" not in n
    ]
    problems += [
        f"tensor {n}: expected shape {s}, found {tuple(tensors[n].shape)}"
        for n, (_, s) in expected.items()
        if n in tensors and tuple(tensors[n].shape) != s
    ]
    if problems:
        raise CheckpointMismatch(
            f"checkpoint {uri} does not fit the {cfg.preset!r} model:\n  " + "\n  ".join(problems)
        )
    dtype = jnp.dtype(cfg.param_dtype)
    for name, (path, _) in expected.items():
        var = _variable(model, path)
        x = _to_ours(name, tensors[name].astype(np.float32), var[...].shape)
        var[...] = jnp.asarray(x, dtype=dtype)


def hf_config(cfg: ModelConfig) -> dict[str, object]:
    """A transformers `config.json` for the model."""
    arch = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2")}
    cls, model_type = arch[cfg.architecture]
    out: dict[str, object] = {
        "architectures": [cls],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": cfg.param_dtype,
    }
    if cfg.architecture == "llama":
        out["attention_bias"] = cfg.qkv_bias
        out["mlp_bias"] = False
    if cfg.rope_scaling == "llama3":
        out["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": cfg.rope_factor,
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_len,
        }
    return out


def model_fields_from_hf(config: Mapping[str, object]) -> dict[str, object]:
    """`ModelConfig` fields read from a transformers `config.json` (Llama or Qwen2)."""
    model_type = config.get("model_type")
    if model_type not in ("llama", "qwen2"):
        raise ValueError(f"model_type {model_type!r} is not supported; allowed: llama, qwen2")
    n_heads = int(config["num_attention_heads"])
    # transformers 4 writes rope_theta/rope_scaling; transformers 5 nests both in rope_parameters.
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    assert isinstance(rope, Mapping)
    fields: dict[str, object] = {
        "preset": "custom",
        "architecture": model_type,
        "vocab_size": config["vocab_size"],
        "d_model": config["hidden_size"],
        "n_layers": config["num_hidden_layers"],
        "n_heads": n_heads,
        "n_kv_heads": config.get("num_key_value_heads", n_heads),
        "head_dim": config.get("head_dim") or int(config["hidden_size"]) // n_heads,
        "d_ff": config["intermediate_size"],
        "rope_theta": float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
        "rms_eps": float(config.get("rms_norm_eps", 1e-6)),
        "qkv_bias": model_type == "qwen2" or bool(config.get("attention_bias", False)),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        "max_seq_len": config.get("max_position_embeddings", 2048),
    }
    if rope.get("rope_type", rope.get("type")) == "llama3":
        fields.update(
            rope_scaling="llama3",
            rope_factor=float(rope["factor"]),
            rope_low_freq_factor=float(rope["low_freq_factor"]),
            rope_high_freq_factor=float(rope["high_freq_factor"]),
            rope_original_max_len=int(rope["original_max_position_embeddings"]),
        )
    return fields


def save(model: Transformer, uri: str, max_shard_bytes: int = 2 << 30) -> list[str]:
    """Write the model as safetensors (sharded with an index past `max_shard_bytes`) + config.json.

    Returns the names of the files written.
    """
    cfg = model.cfg
    out_dtype = ml_dtypes.bfloat16 if cfg.param_dtype == "bfloat16" else np.float32
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, path, shape in _layout(cfg):
        x = _to_hf(name, np.asarray(_variable(model, path)[...], np.float32), shape)
        x = np.ascontiguousarray(x.astype(out_dtype))
        if size and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    written = ["config.json"]
    storage.write_bytes(
        storage.join(uri, "config.json"), json.dumps(hf_config(cfg), indent=2).encode()
    )
    if len(shards) == 1:
        storage.write_bytes(storage.join(uri, SINGLE), safetensors.numpy.save(shards[0]))
        return [*written, SINGLE]
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        storage.write_bytes(storage.join(uri, fname), safetensors.numpy.save(shard))
        weight_map.update(dict.fromkeys(shard, fname))
        written.append(fname)
    total = sum(x.nbytes for s in shards for x in s.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    storage.write_bytes(storage.join(uri, INDEX), json.dumps(index, indent=2).encode())
    return [*written, INDEX]
