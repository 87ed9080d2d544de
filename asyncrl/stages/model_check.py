"""Stage: build the configured model and tokenizer and prove they work end to end.

Builds (or loads) the model, renders a chat prompt, decodes greedily with the KV cache and checks
every step against an uncached full forward, then exports the weights as HF safetensors and
re-imports them, checking the logits are unchanged. Writes its `ModelCheckResult` into the run
folder.
This is the first thing a new checkpoint or preset should pass before it is trained.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from asyncrl.config import RunConfig
from asyncrl.model import build_model, count_params, init_cache
from asyncrl.model import hf_checkpoint as hf
from asyncrl.run_layout import RunLayout, Stage
from asyncrl.tokenize import build_chat_format, build_tokenizer, render
from asyncrl.types import Message, Role

# Largest |logit difference| accepted between two computations of the same float32 forward.
LOGIT_TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCheckResult:
    STAGE: ClassVar[Stage] = Stage.MODEL_CHECK
    params: int
    prompt_tokens: int
    generated: str
    cached_vs_full_max_diff: float
    export_roundtrip_max_diff: float
    exported_files: tuple[str, ...]
    seconds: float
    ok: bool


def model_check(cfg: RunConfig, layout: RunLayout, new_tokens: int = 24) -> ModelCheckResult:
    start = time.perf_counter()
    model = build_model(cfg.model, seed=cfg.seed)
    if cfg.model.checkpoint:
        hf.load_into(model, cfg.model.checkpoint)
    tokenizer = build_tokenizer(cfg.tokenizer)
    fmt = build_chat_format(cfg.tokenizer, tokenizer)
    prompt, _ = render(
        fmt,
        [Message(role=Role.USER, content="What is 17 * 23? Use the calculator.")],
        generation_prompt=True,
    )
    tokens, diff = _greedy_with_check(model, prompt, new_tokens, fmt.stop_tokens)
    export_dir = layout.dir(Stage.MODEL_CHECK) / "model"
    files = hf.save(model, str(export_dir))
    reloaded = build_model(cfg.model, seed=cfg.seed + 1)
    hf.load_into(reloaded, str(export_dir))
    seq = jnp.asarray([prompt + tokens], jnp.int32)
    pos = jnp.arange(seq.shape[1])[None]
    roundtrip = float(jnp.max(jnp.abs(model(seq, pos)[0] - reloaded(seq, pos)[0])))
    result = ModelCheckResult(
        params=count_params(model),
        prompt_tokens=len(prompt),
        generated=tokenizer.decode(tokens),
        cached_vs_full_max_diff=diff if math.isfinite(diff) else 1e30,  # NaN/inf: failed
        export_roundtrip_max_diff=roundtrip if math.isfinite(roundtrip) else 1e30,
        exported_files=tuple(files),
        seconds=round(time.perf_counter() - start, 2),
        ok=diff <= LOGIT_TOLERANCE and roundtrip <= LOGIT_TOLERANCE,
    )
    layout.write(result)
    return result


def _greedy_with_check(model, prompt: list[int], new_tokens: int, stops) -> tuple[list[int], float]:
    """Greedy cached decoding; returns the tokens and the largest cached-vs-full logit gap."""
    cache = init_cache(model.cfg, 1, len(prompt) + new_tokens)
    step = nnx.jit(lambda m, t, p, c: m(t, p, cache=c))
    full = nnx.jit(lambda m, t, p: m(t, p)[0])
    logits, cache = step(model, jnp.asarray([prompt]), jnp.arange(len(prompt))[None], cache)
    seq, out, worst = list(prompt), [], 0.0
    for _ in range(new_tokens):
        ref = full(model, jnp.asarray([seq]), jnp.arange(len(seq))[None])[0, -1]
        worst = max(worst, float(jnp.max(jnp.abs(logits[0, -1] - ref))))
        nxt = int(np.argmax(np.asarray(logits[0, -1])))
        out.append(nxt)
        seq.append(nxt)
        if nxt in stops:
            break
        pos = jnp.asarray([[len(seq) - 1]])
        logits, cache = step(model, jnp.asarray([[nxt]]), pos, cache)
    jax.block_until_ready(logits)
    return out, worst
