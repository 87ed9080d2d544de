"""Checks a peer's request field by field before anything reaches the engine.

Pure functions from a decoded JSON object to a typed request, or a `WireError` naming the field.
The engine writes requests into int32 / float32 host arrays on its decode thread, where an
out-of-range value would kill it for every caller; so every integer is range-checked here (token
ids against the vocabulary, counts against the context window), every float must be finite, and
booleans are not integers. A bad request fails alone: nothing here has state.
"""

from __future__ import annotations

import math

from asyncrl.serving.wire import INT32_MAX, ErrorCode, WireError, WireLimits
from asyncrl.types import GenerateRequest, SamplingParams

SEED_MAX = 2**63 - 1  # seeds are 64-bit PRNG key data; the orchestrator's are 63-bit
REQUEST_KEYS = frozenset({"prompt", "params", "session", "timeout_s"})
PARAM_KEYS = frozenset(SamplingParams.__dataclass_fields__)


def _bad(field: str, allowed: str) -> WireError:
    return WireError(ErrorCode.BAD_REQUEST, f"{field}: expected {allowed}")


def _int(value: object, field: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise _bad(field, f"an integer in [{lo}, {hi}]")
    return value


def _float(
    value: object, field: str, lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False
) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _bad(field, "a finite number")
    if not lo <= value <= hi or (open_lo and value == lo) or (open_hi and value == hi):
        raise _bad(
            field, f"a number in {'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}"
        )
    return float(value)


def _list(value: object, field: str, max_items: int) -> list[object]:
    if not isinstance(value, list) or len(value) > max_items:
        raise _bad(field, f"a list of at most {max_items} items")
    return value


def _str(value: object, field: str, max_chars: int) -> str:
    if not isinstance(value, str) or len(value) > max_chars:
        raise _bad(field, f"a string of at most {max_chars} characters")
    return value


def _keys(d: object, field: str, allowed: frozenset[str], required: frozenset[str]) -> dict:
    if not isinstance(d, dict):
        raise _bad(field, "a JSON object")
    unknown, missing = set(d) - allowed, required - set(d)
    if unknown or missing:
        which = sorted(unknown)[0] if unknown else sorted(missing)[0]
        raise _bad(f"{field}.{which:.40}", "no unknown and no missing fields")
    return d


def tokens(value: object, field: str, limits: WireLimits, max_items: int) -> tuple[int, ...]:
    items = _list(value, field, max_items)
    return tuple(_int(t, f"{field}[{i}]", 0, limits.vocab_size - 1) for i, t in enumerate(items))


def sampling_params(d: object, limits: WireLimits) -> SamplingParams:
    p = _keys(d, "params", PARAM_KEYS, PARAM_KEYS)
    seed = p["seed"]
    return SamplingParams(
        max_tokens=_int(p["max_tokens"], "params.max_tokens", 1, limits.max_len),
        temperature=_float(p["temperature"], "params.temperature", 0.0, limits.max_temperature),
        top_k=_int(p["top_k"], "params.top_k", 0, limits.vocab_size),
        top_p=_float(p["top_p"], "params.top_p", 0.0, 1.0, open_lo=True),
        min_p=_float(p["min_p"], "params.min_p", 0.0, 1.0, open_hi=True),
        repetition_penalty=_float(
            p["repetition_penalty"], "params.repetition_penalty", 0.0, 1e3, open_lo=True
        ),
        stop_tokens=tokens(p["stop_tokens"], "params.stop_tokens", limits, limits.max_stop_tokens),
        stop_strings=tuple(
            _str(s, "params.stop_strings[]", limits.max_stop_chars)
            for s in _list(p["stop_strings"], "params.stop_strings", limits.max_stop_strings)
        ),
        seed=None if seed is None else _int(seed, "params.seed", 0, SEED_MAX),
    )


def generate_request(d: object, limits: WireLimits) -> GenerateRequest:
    """A `generate` message's request, or `WireError` (BAD_REQUEST / PROMPT_TOO_LONG)."""
    r = _keys(d, "request", REQUEST_KEYS, REQUEST_KEYS)
    prompt = r["prompt"]
    if isinstance(prompt, list) and not prompt:
        raise _bad("request.prompt", "at least one token")
    if isinstance(prompt, list) and len(prompt) >= limits.max_len:
        raise WireError(
            ErrorCode.PROMPT_TOO_LONG,
            f"a prompt of {len(prompt)} tokens leaves no room in a context of {limits.max_len}",
        )
    timeout = r["timeout_s"]
    return GenerateRequest(
        prompt=tokens(prompt, "request.prompt", limits, limits.max_len - 1),
        params=sampling_params(r["params"], limits),
        session=_str(r["session"], "request.session", limits.max_session_chars),
        timeout_s=None
        if timeout is None
        else _float(timeout, "request.timeout_s", 0.0, limits.max_timeout_s, open_lo=True),
    )


def publish_version(value: object) -> int:
    return _int(value, "version", 0, INT32_MAX)
