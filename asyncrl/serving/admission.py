"""What a rollout replica must show to be (re-)admitted, when a dead one is probed again, and the
typed record of each replica's state changes.

Owns the pure parts of re-admission: the model digest both sides compute from the config (a
replica reports it in every health reply; the trainer admits only its own), the backed-off,
jittered probe schedule, and the `Transition` records. The probing itself (authentication, the
weights catch-up, routing) is the client's (`client.py`); nothing here does I/O.
Invariant: a probe is never due sooner than half the base interval after the previous one (no
busy loop), nor later than the backoff cap.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import random

from asyncrl.config import RunConfig

# Fraction of each probe delay drawn at random, so replicas lost together are not probed together.
JITTER = 0.5


class ReplicaState(enum.StrEnum):
    ALIVE = "alive"  # in service since the client started
    DEAD = "dead"  # out of service; probed with backoff until it passes again
    READMITTED = "readmitted"  # in service again: it passed a probe and holds the current weights


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """A replica entering `state`."""

    replica: str  # host:port
    state: ReplicaState
    at: float  # time.time()
    cause: str = ""  # why it died (DEAD only)
    version: int | None = None  # the policy version it was brought to (READMITTED only)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Seconds between probes of one dead replica: doubling from `base_s` up to `max_s`."""

    base_s: float
    max_s: float

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s < float("inf"):
            raise ValueError(f"Backoff needs 0 < base_s <= max_s < inf, got {self}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The wait before the probe after `attempt` failed ones (0: the first after the death),
        in (1 - JITTER, 1] times min(max_s, base_s * 2**attempt)."""
        ceiling = min(self.max_s, self.base_s * 2.0 ** min(attempt, 64))
        return ceiling * (1.0 - JITTER * rng.random())


def model_digest(cfg: RunConfig) -> str:
    """What must match between the trainer and a replica for its completions to be trainable:
    the model, the tokenizer and the context window (a SHA-256 of their config values)."""
    fields = {
        "model": dataclasses.asdict(cfg.model),
        "tokenizer": dataclasses.asdict(cfg.tokenizer),
        "max_context": cfg.env.max_context,
    }
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def incompatibility(reply: dict[str, object], digest: str) -> str:
    """Why a health reply's replica may not serve this trainer ('' if it may; an empty `digest`
    checks nothing)."""
    if not digest or reply.get("model") == digest:
        return ""
    got = reply.get("model")
    shown = f"{got:.12}" if isinstance(got, str) else "none"
    return f"it serves model {shown}..., the trainer's is {digest:.12}..."
