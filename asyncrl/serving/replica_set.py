"""The trainer's record of its rollout replicas: each one's address, load and state, and the log
of every state change.

Owns the bookkeeping: a `Replica` per address (requests in flight, why it died, its probes and
when the next is due), the `lost` list and the typed `Transition`s (each also an instant on the
trace's "replicas" track), and the backed-off probe schedule of a dead replica. Not the talking to
replicas nor the decision to re-admit one (`client.py`). Invariant: state changes and their
records happen together under one lock, and a failure seen before a re-admission never marks the
re-admitted replica dead.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time

from asyncrl import tracing
from asyncrl.serving.admission import Backoff, ReplicaState, Transition

log = logging.getLogger("asyncrl.serving")


@dataclasses.dataclass
class Replica:
    host: str
    port: int
    state: ReplicaState = ReplicaState.ALIVE
    in_flight: int = 0
    cause: str = ""  # why it was last marked dead
    admissions: int = 0  # re-admissions so far: a failure seen by an earlier one is stale
    probes: int = 0  # probes since it died
    probe_error: str = ""  # why the last probe did not re-admit it
    next_probe_at: float = 0.0  # time.monotonic() of its next probe (when dead)

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.state is not ReplicaState.DEAD


class ReplicaSet:
    """The replicas at `addresses`, all alive at first, probed on `backoff` once dead."""

    def __init__(self, addresses: list[tuple[str, int]], backoff: Backoff) -> None:
        self.replicas = [Replica(h, p) for h, p in addresses]
        self.lost: list[str] = []  # names, in the order they died
        self.transitions: list[Transition] = []
        self._backoff = backoff
        self._rng = random.Random()
        self._lock = threading.Lock()
        for replica in self.replicas:  # no other thread runs yet
            self._record(replica, ReplicaState.ALIVE)

    @property
    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    @property
    def slots_in_use(self) -> int:
        return sum(r.in_flight for r in self.replicas)

    def causes(self) -> str:
        """Why each replica died, for an error that no replica is left."""
        return "; ".join(f"{r.name}: {r.cause}" for r in self.replicas) or "none configured"

    def _record(self, replica: Replica, state: ReplicaState, **details) -> None:
        """Keep a state change (the caller holds `_lock`, or no other thread runs yet)."""
        change = Transition(replica=replica.name, state=state, at=time.time(), **details)
        self.transitions.append(change)
        tracer = tracing.get()
        args = {k: v for k, v in details.items() if v is not None}
        tracer.instant(tracer.track("replicas"), f"{replica.name} {state.value}", args)

    def mark_dead(self, replica: Replica, cause: str, admissions: int | None = None) -> None:
        """Out of service until a probe passes; `admissions`: the one the failure was seen in
        (a failure of the process before a re-admission says nothing about the new one)."""
        with self._lock:
            if not replica.alive or admissions not in (None, replica.admissions):
                return
            replica.state, replica.cause = ReplicaState.DEAD, cause
            replica.probes, replica.probe_error = 0, ""
            replica.next_probe_at = time.monotonic() + self._backoff.delay(0, self._rng)
            self.lost.append(replica.name)
            self._record(replica, ReplicaState.DEAD, cause=cause)
        log.warning("rollout replica %s is out of service: %s", replica.name, cause)

    def readmit(self, replica: Replica, version: int | None) -> None:
        """In service again, holding weights `version` (None: nothing was published yet)."""
        with self._lock:
            replica.state, replica.admissions = ReplicaState.READMITTED, replica.admissions + 1
            self._record(replica, ReplicaState.READMITTED, version=version)

    def probe_failed(self, replica: Replica, error: str) -> None:
        """The latest probe of `replica` did not re-admit it: the next waits the next backoff."""
        replica.probe_error = error
        wait = self._backoff.delay(replica.probes, self._rng)
        replica.next_probe_at = time.monotonic() + wait
        log.info("probe %d of %s: %s", replica.probes, replica.name, error)

    def seconds_to_next_probe(self, idle_s: float) -> float:
        """How long the prober may sleep: until the next due probe, at least 0.01 s (no busy
        loop), at most `idle_s` (a replica that dies meanwhile is not left waiting)."""
        now = time.monotonic()
        wake = min((r.next_probe_at for r in self.replicas if not r.alive), default=now)
        return min(max(wake - now, 0.01), idle_s)
