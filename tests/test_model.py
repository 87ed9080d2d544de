"""The transformer: cached decoding equals the full forward; sharding does not change the result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from asyncrl.model import build_model, init_cache
from asyncrl.model.layers import rope_inv_freq
from asyncrl.model.sharding import make_mesh, partition_spec, shard_model
from asyncrl.testing.configs import model_config

# float32 forward computed two ways (different op order / devices): largest accepted |Δlogit|.
TOL = 1e-4


@nnx.jit(static_argnames="window")
def _forward(model, tokens, positions, valid=None, cache=None, window=None):
    """The model's forward, jitted: one compile per shape instead of one per eager op and shape."""
    return model(tokens, positions, valid=valid, cache=cache, window=window)


def _tokens(batch, length, vocab=256, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (batch, length)), jnp.int32)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"architecture": "llama", "qkv_bias": False, "tie_embeddings": False},
        {"rope_scaling": "llama3", "rope_factor": 8.0, "rope_original_max_len": 64},
    ],
    ids=["qwen2", "llama-untied", "llama3-rope"],
)
def test_cached_decode_equals_full_forward(fields):
    cfg = model_config("micro", **fields)
    model = build_model(cfg, seed=3)
    seq = _tokens(2, 20)
    pos = jnp.broadcast_to(jnp.arange(20), (2, 20))
    full, _ = _forward(model, seq, pos)
    cache = init_cache(cfg, 2, 32)
    out, cache = _forward(model, seq[:, :12], pos[:, :12], cache=cache)
    steps = [out]
    for t in range(12, 20):
        out, cache = _forward(model, seq[:, t : t + 1], pos[:, t : t + 1], cache=cache, window=24)
        steps.append(out)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=TOL, rtol=0)


def test_rows_at_different_offsets_match_their_own_full_forward():
    """Continuous batching: two rows decoded together at different positions, padded prefill."""
    cfg = model_config("micro")
    model = build_model(cfg, seed=4)
    a, b = _tokens(1, 9, seed=1)[0], _tokens(1, 5, seed=2)[0]
    cache = init_cache(cfg, 2, 32)
    # Prefill both rows in one padded call of width 9; row b's padding sits beyond its length.
    toks = jnp.stack([a, jnp.concatenate([b, jnp.zeros(4, jnp.int32)])])
    pos = jnp.broadcast_to(jnp.arange(9), (2, 9))
    valid = jnp.asarray([[True] * 9, [True] * 5 + [False] * 4])
    logits, cache = _forward(model, toks, pos, valid=valid, cache=cache)
    last = [logits[0, 8], logits[1, 4]]
    seqs = [list(np.asarray(a)), list(np.asarray(b))]
    for _ in range(4):
        nxt = [int(jnp.argmax(x)) for x in last]
        for s, n in zip(seqs, nxt, strict=True):
            s.append(n)
        step_pos = jnp.asarray([[len(seqs[0]) - 1], [len(seqs[1]) - 1]])
        logits, cache = _forward(model, jnp.asarray([[n] for n in nxt]), step_pos, cache=cache)
        last = [logits[0, 0], logits[1, 0]]
    for row, s in enumerate(seqs):
        full, _ = _forward(model, jnp.asarray([s]), jnp.arange(len(s))[None])
        np.testing.assert_allclose(last[row], full[0, -1], atol=TOL, rtol=0)


def test_padding_does_not_leak_into_real_tokens():
    cfg = model_config("micro")
    model = build_model(cfg, seed=5)
    seq = _tokens(1, 6)
    ref, _ = _forward(model, seq, jnp.arange(6)[None])
    padded = jnp.concatenate([seq, _tokens(1, 4, seed=9)], axis=1)
    valid = jnp.asarray([[True] * 6 + [False] * 4])
    out, _ = _forward(model, padded, jnp.arange(10)[None], valid=valid)
    np.testing.assert_allclose(out[:, :6], ref, atol=TOL, rtol=0)


def test_sharded_forward_on_four_devices_equals_single_device():
    assert len(jax.devices()) >= 4, "conftest sets 4 virtual CPU devices"
    cfg = model_config("micro")
    model = build_model(cfg, seed=6)
    seq = _tokens(4, 16)
    pos = jnp.broadcast_to(jnp.arange(16), (4, 16))
    ref, _ = _forward(model, seq, pos)
    mesh = make_mesh(jax.devices()[:4], data=1, fsdp=2, tensor=2)
    shard_model(model, mesh)
    q = model.blocks[0].attn.q[...]
    assert len(q.sharding.device_set) == 4 and q.sharding.spec == P("fsdp", "tensor", None)
    out = nnx.jit(lambda m, t, p: m(t, p)[0])(model, seq, pos)
    np.testing.assert_allclose(out, ref, atol=TOL, rtol=0)


def test_partition_spec_replicates_dimensions_the_mesh_does_not_divide():
    mesh = make_mesh(jax.devices()[:4], data=1, fsdp=1, tensor=4)
    # 2 KV heads cannot split 4 ways: replicated, not an error.
    assert partition_spec(("embed", "kv_heads", "head_dim"), (64, 2, 16), mesh) == P(
        None, None, None
    )
    assert partition_spec(("embed", "heads", "head_dim"), (64, 4, 16), mesh) == P(
        None, "tensor", None
    )


def test_llama3_rope_scaling_matches_reference_formula():
    cfg = model_config("micro", rope_scaling="llama3", rope_factor=8.0, rope_original_max_len=64)
    plain = rope_inv_freq(model_config("micro"))
    scaled = rope_inv_freq(cfg)
    wavelen = 2 * np.pi / plain
    # Long wavelengths are divided by the factor, short ones untouched (the Llama 3.1 rule).
    np.testing.assert_allclose(scaled[wavelen > 64], plain[wavelen > 64] / 8.0, rtol=1e-6)
    np.testing.assert_allclose(scaled[wavelen < 16], plain[wavelen < 16], rtol=1e-6)


def test_presets_have_their_published_parameter_counts():
    # Qwen2.5-0.5B: 494M parameters with tied embeddings (Hugging Face model card: 0.49B).
    cfg = model_config("qwen2.5-0.5b")
    shapes = jax.eval_shape(lambda: nnx.state(build_model(cfg), nnx.Param))
    total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    assert 490e6 < total < 500e6
