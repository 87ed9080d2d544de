"""HF safetensors import/export: round trips reproduce logits; bad checkpoints say what is wrong."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from asyncrl import storage
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf
from asyncrl.testing.configs import model_config


def _logits(model):
    seq = jnp.asarray([[5, 17, 99, 3, 250, 42, 7, 1]])
    return np.asarray(model(seq, jnp.arange(8)[None])[0])


@pytest.mark.parametrize("shard_bytes", [2 << 30, 60_000], ids=["single", "sharded"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_export_import_reproduces_logits(tmp_path, shard_bytes, arch):
    fields = {"architecture": arch, "qkv_bias": arch == "qwen2", "tie_embeddings": arch == "qwen2"}
    cfg = model_config("micro", **fields)
    model = build_model(cfg, seed=1)
    files = hf.save(model, str(tmp_path), max_shard_bytes=shard_bytes)
    assert (hf.INDEX in files) == (shard_bytes < 2 << 30)
    other = build_model(cfg, seed=2)
    assert not np.allclose(_logits(other), _logits(model))
    hf.load_into(other, str(tmp_path))
    np.testing.assert_array_equal(_logits(other), _logits(model))


def test_written_tensors_use_hf_names_and_layouts(tmp_path):
    cfg = model_config("micro")
    model = build_model(cfg, seed=1)
    hf.save(model, str(tmp_path))
    tensors = safetensors.numpy.load_file(str(tmp_path / hf.SINGLE))
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (cfg.n_heads * cfg.head_dim, cfg.d_model)
    # HF computes x @ W.T; ours is einsum over [D, N, H]: the same numbers, transposed.
    ours = np.asarray(model.blocks[0].attn.q[...]).reshape(cfg.d_model, -1)
    np.testing.assert_array_equal(q, ours.T)
    config = json.loads((tmp_path / "config.json").read_text())
    assert hf.model_fields_from_hf(config)["n_kv_heads"] == cfg.n_kv_heads


def test_missing_and_misshaped_tensors_are_named(tmp_path):
    cfg = model_config("micro")
    hf.save(build_model(cfg), str(tmp_path))
    path = tmp_path / hf.SINGLE
    tensors = dict(safetensors.numpy.load_file(str(path)))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.norm.weight"] = np.ones(cfg.d_model + 1, np.float32)
    tensors["model.layers.0.extra.weight"] = np.ones(2, np.float32)
    safetensors.numpy.save_file(tensors, str(path))
    with pytest.raises(hf.CheckpointMismatch) as info:
        hf.load_into(build_model(cfg), str(tmp_path))
    msg = str(info.value)
    assert "missing tensor model.layers.1.mlp.up_proj.weight (expected shape (128, 64))" in msg
    assert f"tensor model.norm.weight: expected shape (64,), found ({cfg.d_model + 1},)" in msg
    assert "unexpected tensor model.layers.0.extra.weight" in msg


def test_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"neither model\.safetensors nor"):
        hf.load_into(build_model(model_config("micro")), str(tmp_path))


def test_round_trip_through_gcs_emulator(gcs_bucket):
    cfg = model_config("micro")
    model = build_model(cfg, seed=1)
    uri = storage.join(gcs_bucket, "models", "micro")
    hf.save(model, uri, max_shard_bytes=60_000)
    assert hf.INDEX in storage.list_names(uri)
    other = build_model(cfg, seed=2)
    hf.load_into(other, uri)
    np.testing.assert_array_equal(_logits(other), _logits(model))


def test_bfloat16_params_are_cast_on_import(tmp_path):
    cfg32 = model_config("micro")
    model = build_model(cfg32, seed=1)
    hf.save(model, str(tmp_path))
    bf = build_model(model_config("micro", param_dtype="bfloat16", dtype="bfloat16"), seed=2)
    hf.load_into(bf, str(tmp_path))
    assert bf.embed[...].dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(bf.embed[...], np.float32), np.asarray(model.embed[...]), rtol=1e-2, atol=1e-3
    )
