"""Reference decoding for tests and benchmarks: the naive full forward, one token at a time."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from asyncrl.model import Transformer


@nnx.jit
def _full_forward(model: Transformer, tokens: jax.Array) -> jax.Array:
    return model(tokens, jnp.arange(tokens.shape[1])[None])[0][0]


def full_logprobs(
    model: Transformer, sequence: Sequence[int], vocab_limit: int | None = None
) -> np.ndarray:
    """log-softmax of the full forward at every position of `sequence` ([T, V'])

    over the first `vocab_limit` ids (all by default), as an engine with that limit samples."""
    n = len(sequence)
    logits = _full_forward(model, jnp.asarray([_padded(sequence)], jnp.int32))[:n]
    return np.asarray(jax.nn.log_softmax(logits[:, :vocab_limit], axis=-1))


def _padded(sequence: Sequence[int]) -> list[int]:
    """`sequence` padded at the end to the next power of two (at least 16).

    Attention is causal, so tokens after position t never change the logits at t: the padded
    forward's first len(sequence) rows are the unpadded forward's, and the full forward compiles
    once per power of two instead of once per length (a greedy reference over a few prompts
    otherwise compiled dozens of shapes)."""
    size = max(16, 1 << (len(sequence) - 1).bit_length())
    return [*sequence, *[0] * (size - len(sequence))]


def naive_greedy(
    model: Transformer,
    prompt: Sequence[int],
    max_tokens: int,
    stop: Sequence[int] = (),
    vocab_limit: int | None = None,
) -> list[int]:
    """Greedy decoding by re-running the full forward over the whole sequence for each token."""
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        tok = int(np.argmax(full_logprobs(model, seq, vocab_limit)[-1]))
        out.append(tok)
        seq.append(tok)
        if tok in stop:
            break
    return out
