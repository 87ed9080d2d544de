"""Our logits against Hugging Face `transformers` on tiny random Llama and Qwen2 models.

The reference model is created by `transformers` itself, saved with `save_pretrained`, and loaded
by our importer from its config.json and safetensors; skipped when torch/transformers are absent.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from asyncrl.config import ModelConfig, from_dict
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.parity

# Required agreement of float32 logits with the reference (issue 2).
PARITY_TOL = 1e-4

COMMON = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def _reference(kind: str):
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**COMMON, rope_theta=1e6, tie_word_embeddings=True)
        return transformers.Qwen2ForCausalLM(cfg)
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    cfg = transformers.LlamaConfig(
        **COMMON, rope_theta=500000.0, tie_word_embeddings=False, rope_scaling=rope
    )
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_logits_match_transformers(kind, tmp_path):
    torch.manual_seed(0)
    ref = _reference(kind).float().eval()
    with torch.no_grad():  # random non-zero biases and norms, so every parameter matters
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    fields = hf.model_fields_from_hf(json.loads((tmp_path / "config.json").read_text()))
    ours = build_model(from_dict(ModelConfig, fields))
    hf.load_into(ours, str(tmp_path))
    ids = np.random.default_rng(0).integers(0, 300, (2, 48))
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    got, _ = ours(jnp.asarray(ids, jnp.int32), jnp.broadcast_to(jnp.arange(48), (2, 48)))
    np.testing.assert_allclose(np.asarray(got), expected, atol=PARITY_TOL, rtol=0)


def test_our_export_loads_in_transformers(tmp_path):
    cfg = from_dict(ModelConfig, {"preset": "micro"})
    ours = build_model(cfg, seed=3)
    hf.save(ours, str(tmp_path))
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32)
    ids = np.random.default_rng(1).integers(0, 300, (1, 32))
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    got, _ = ours(jnp.asarray(ids, jnp.int32), jnp.arange(32)[None])
    np.testing.assert_allclose(np.asarray(got), expected, atol=PARITY_TOL, rtol=0)
