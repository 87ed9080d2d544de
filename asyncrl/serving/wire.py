"""The rollout wire protocol: framing, error codes and the JSON form of requests and completions.

One connection carries one exchange: the client sends one JSON object on one line, the replica
answers with one JSON object on one line and closes.
    {"token": T, "op": "generate", "request": {...}}       -> {"ok": true, "completion": {...}}
    {"token": T, "op": "publish", "version": v, "path": "v<v>"} -> {"ok": true, "version": v}
    {"token": T, "op": "health"}   -> {"ok": true, "version": v, "slots_in_use": n, "model": d}
    any failure                    -> {"ok": false, "error": <ErrorCode>, "message": short text}
(d: the replica's model digest, `admission.model_digest`; the trainer admits only its own.)

Owns the byte limits of both directions (`WireLimits`, derived from the context window, so the
largest completion a config allows always fits) and the decoding of a peer's bytes into a dict.
It does not validate a request's content (`validation.py`) and performs no I/O. An error message
never carries exception text or a server path: the peer learns a code and a fixed sentence.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from asyncrl.types import Completion, FinishReason, GenerateRequest

INT32_MAX = 2**31 - 1
# Bytes of one completion token in the reply: a token id (<= 10 digits), two float reprs
# (<= 24 characters each) and a version (<= 10 digits), with separators; 128 leaves headroom.
REPLY_BYTES_PER_TOKEN = 128
# A prompt token is at most 10 digits and ", ".
REQUEST_BYTES_PER_TOKEN = 16
# json.dumps escapes a character in at most 6 bytes (\uXXXX); 12 for a surrogate pair.
BYTES_PER_CHAR = 12


class ErrorCode(enum.StrEnum):
    AUTH = "auth"  # no token, or the wrong one: nothing else is served
    BUSY = "busy"  # the replica is at its connection cap
    TIMEOUT = "timeout"  # the peer did not send its request in time
    TOO_LARGE = "too_large"  # the request line is over the replica's byte limit
    BAD_JSON = "bad_json"  # not one UTF-8 JSON value (or nested / numbered beyond the parser)
    BAD_REQUEST = "bad_request"  # a field is missing, of the wrong type or out of range
    UNKNOWN_OP = "unknown_op"
    PROMPT_TOO_LONG = "prompt_too_long"  # the prompt leaves no room in the context window
    BAD_PATH = "bad_path"  # a publish named anything but v<version> under the weights root
    LOAD_FAILED = "load_failed"  # the version folder could not be loaded
    ENGINE_CLOSED = "engine_closed"  # the replica's engine is closed or dead: it serves no more
    ENGINE_ERROR = "engine_error"  # the engine failed this request (and stays up)
    # Client-side only: the reply broke the protocol or was over the client's limit.
    BAD_REPLY = "bad_reply"
    REPLY_TOO_LARGE = "reply_too_large"
    INCOMPATIBLE = "incompatible"  # the replica serves another model, tokenizer or context


class WireError(Exception):
    """A request (or reply) refused with `code`; `message` is safe to show the peer."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    def reply(self) -> dict[str, object]:
        return error_reply(self.code, self.message)


def error_reply(code: ErrorCode, message: str) -> dict[str, object]:
    return {"ok": False, "error": code.value, "message": message}


@dataclass(frozen=True, slots=True, kw_only=True)
class WireLimits:
    """What one request may ask for; every bound is checked before the request is queued."""

    vocab_size: int  # token ids (prompt, stop tokens) must lie in [0, vocab_size)
    max_len: int  # the engine's context window: prompt + completion tokens
    max_stop_tokens: int = 64
    max_stop_strings: int = 16
    max_stop_chars: int = 256  # characters of one stop string
    max_session_chars: int = 256
    max_timeout_s: float = 3600.0  # a request's own deadline
    max_temperature: float = 1e3  # sampling arrays are float32: keep 1/temperature finite

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len"):
            value = getattr(self, name)
            if not 0 < value <= INT32_MAX:
                raise ValueError(f"WireLimits.{name} must be in [1, {INT32_MAX}], got {value}")

    @property
    def request_bytes(self) -> int:
        """The longest request line a valid request can make, and so the replica's read limit."""
        stops = self.max_stop_tokens * REQUEST_BYTES_PER_TOKEN
        stops += self.max_stop_strings * (self.max_stop_chars * BYTES_PER_CHAR + 4)
        session = self.max_session_chars * BYTES_PER_CHAR
        return 4096 + self.max_len * REQUEST_BYTES_PER_TOKEN + stops + session

    @property
    def reply_bytes(self) -> int:
        """The longest reply line: a completion can never be longer than the context window."""
        return reply_bytes_for(self.max_len)


def reply_bytes_for(max_len: int) -> int:
    return 4096 + max_len * REPLY_BYTES_PER_TOKEN


def encode(message: dict[str, object]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, object]:
    """One JSON object from a peer's line; anything else is a `WireError`, never a traceback."""
    try:
        value = json.loads(line)
    except RecursionError:  # nesting deeper than the parser's stack
        raise WireError(ErrorCode.BAD_JSON, "JSON nested too deeply") from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, integers beyond 4300 digits
        raise WireError(ErrorCode.BAD_JSON, "not a JSON value") from None
    if not isinstance(value, dict):
        raise WireError(ErrorCode.BAD_REQUEST, "a message must be a JSON object")
    return value


def request_to_json(r: GenerateRequest) -> dict[str, object]:
    p = r.params
    return {
        "prompt": [int(t) for t in r.prompt],
        "params": {
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_k": p.top_k,
            "top_p": p.top_p,
            "min_p": p.min_p,
            "repetition_penalty": p.repetition_penalty,
            "stop_tokens": list(p.stop_tokens),
            "stop_strings": list(p.stop_strings),
            "seed": p.seed,
        },
        "session": r.session,
        "timeout_s": r.timeout_s,
    }


def completion_to_json(c: Completion) -> dict[str, object]:
    return {
        "tokens": [int(t) for t in c.tokens],
        "logprobs": [float(x) for x in c.logprobs],
        "raw_logprobs": [float(x) for x in c.raw_logprobs],
        "versions": [int(v) for v in c.versions],
        "finish_reason": c.finish_reason.value,
        "prompt_tokens": int(c.prompt_tokens),
        "cached_tokens": int(c.cached_tokens),
    }


def completion_from_json(d: object) -> Completion:
    """A replica's completion; a malformed one is a `WireError(BAD_REPLY)`."""
    bad = WireError(ErrorCode.BAD_REPLY, "malformed completion")
    if not isinstance(d, dict):
        raise bad
    try:
        columns = {k: tuple(d[k]) for k in ("tokens", "logprobs", "raw_logprobs", "versions")}
        counts = (d["prompt_tokens"], d["cached_tokens"])
        reason = FinishReason(d["finish_reason"])
    except (KeyError, TypeError, ValueError):
        raise bad from None
    ints = columns["tokens"] + columns["versions"] + counts
    floats = columns["logprobs"] + columns["raw_logprobs"]
    if (
        len({len(v) for v in columns.values()}) != 1
        or not all(type(x) is int for x in ints)
        or not all(type(x) in (int, float) for x in floats)
        or min(counts) < 0
    ):
        raise bad
    return Completion(
        **columns, finish_reason=reason, prompt_tokens=counts[0], cached_tokens=counts[1]
    )
