"""`ClientSettings`: how the trainer's rollout client talks to its replicas and judges them.

Owns the client's knobs (connect, reply, health and publish timeouts, the reply size cap, how many
weight folders stay, the probe backoff, the model digest a replica must serve) and how they derive
from a `RunConfig`. Not the exchanges themselves (`exchange.py`) nor the routing (`client.py`).
Invariant: the reply cap fits the reply of the largest context the config allows.
"""

from __future__ import annotations

import dataclasses

from asyncrl.config import RunConfig
from asyncrl.serving.admission import model_digest
from asyncrl.serving.wire import reply_bytes_for

# Over this a reply is refused: the reply of the largest context any config allows fits.
DEFAULT_REPLY_BYTES = 64 * 2**20


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClientSettings:
    connect_timeout_s: float = 10.0
    # A reply may come this long after the request's own deadline (the replica enforces that).
    reply_grace_s: float = 30.0
    # The deadline of a request without one (rollout.request_timeout_s on the replica).
    request_timeout_s: float = 120.0
    health_timeout_s: float = 10.0
    publish_timeout_s: float = 300.0
    max_reply_bytes: int = DEFAULT_REPLY_BYTES
    keep_versions: int = 2  # weight folders kept after a publish (the one just sent included)
    # Waits between probes of a dead replica (cluster.rollout_probe_*; admission.Backoff).
    probe_interval_s: float = 5.0
    probe_max_backoff_s: float = 60.0
    # The model digest a replica's health must report ('' = not checked).
    model_digest: str = ""

    @classmethod
    def of(cls, cfg: RunConfig) -> ClientSettings:
        """The trainer's settings for `cfg`: the largest reply its context allows, its request
        deadline, `cluster.rollout_keep_versions` weight folders kept, the probe backoff, and the
        model digest its replicas must serve."""
        return cls(
            max_reply_bytes=reply_bytes_for(cfg.env.max_context),
            request_timeout_s=cfg.rollout.request_timeout_s,
            keep_versions=cfg.cluster.rollout_keep_versions,
            probe_interval_s=cfg.cluster.rollout_probe_interval_s,
            probe_max_backoff_s=cfg.cluster.rollout_probe_max_backoff_s,
            model_digest=model_digest(cfg),
        )
