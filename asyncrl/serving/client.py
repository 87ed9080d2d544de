"""`RemoteEngine`: the trainer's `RolloutEngine` over rollout replicas in other processes.

Each request goes to the live replica with the fewest requests in flight, over one authenticated
connection (protocol in `wire.py`, server in `server.py`). A replica is marked dead when it stops
answering (refused, reset, silent past the request's deadline plus a grace), breaks the protocol,
refuses our token, serves another model (health's digest, `admission.py`), or reports its engine
closed (health included); the request then fails with `EngineClosed`, so the episode ends as
cancelled and the group queue's retry policy re-issues it under the same group id on a live
replica. With no live replica left the engine is `exhausted` and the orchestrator ends the run
with `EngineClosed`, naming why each replica died. A request the replica refuses alone (bad
request, busy, an engine error) raises `RemoteError` and leaves the replica alive.

A dead replica is probed again in the background (a restarted pod keeps its DNS name; the name is
resolved anew on every connection), with backed-off, jittered waits (`admission.Backoff`), each
probe bounded by the connect and health timeouts. It is re-admitted once it answers a health call
with our token (the path every request takes) and our model digest, and has loaded the current
weight version; only then is it live again. Every state change is a typed `Transition` in
`transitions` and an instant on the trace's "replicas" track.

Weights travel as a safetensors folder per version under a directory both sides read (the run
folder; on GKE a gs:// folder mounted with Cloud Storage FUSE): the trainer writes `v<version>/`
once and tells every live replica its name; once they have all answered, versions older than the
last `keep_versions` are deleted (the writer prunes: replicas only read).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl import tracing
from asyncrl.config import RunConfig
from asyncrl.sampling.protocol import EngineClosed, PromptTooLong
from asyncrl.sampling.stats import EngineStats
from asyncrl.serving import weights
from asyncrl.serving.admission import (
    Backoff,
    ReplicaState,
    Transition,
    incompatibility,
    model_digest,
)
from asyncrl.serving.auth import Token, load_token, token_file_from_env
from asyncrl.serving.wire import (
    ErrorCode,
    WireError,
    completion_from_json,
    decode,
    encode,
    reply_bytes_for,
    request_to_json,
)
from asyncrl.types import Completion, GenerateRequest

log = logging.getLogger("asyncrl.serving")
# Over this a reply is refused: the reply of the largest context any config allows fits.
DEFAULT_REPLY_BYTES = 64 * 2**20
# Replies that only the request fails on; every other error code means the replica is unusable.
REQUEST_ERRORS = frozenset(
    {
        ErrorCode.BUSY,
        ErrorCode.TIMEOUT,
        ErrorCode.TOO_LARGE,
        ErrorCode.BAD_REQUEST,
        ErrorCode.PROMPT_TOO_LONG,
        ErrorCode.ENGINE_ERROR,
        ErrorCode.LOAD_FAILED,
        ErrorCode.REPLY_TOO_LARGE,
    }
)


class RemoteError(RuntimeError):
    """A replica refused or failed one request and stays in service."""

    def __init__(self, replica: str, code: ErrorCode, message: str) -> None:
        super().__init__(f"rollout replica {replica}: {code.value}: {message}")
        self.code = code


class _Refused(Exception):
    """One exchange that got no ok reply: the code and a short text (never the token)."""

    def __init__(self, code: ErrorCode, text: str) -> None:
        super().__init__(f"{code.value}: {text}")
        self.code, self.text = code, text


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


async def _exchange(
    replica: Replica, message: dict, timeout_s: float, settings: ClientSettings
) -> dict:
    """One request/reply; `WireError` for a reply that breaks the protocol, OSError/TimeoutError
    for a replica that does not answer."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(replica.host, replica.port, limit=settings.max_reply_bytes),
        settings.connect_timeout_s,
    )
    try:
        writer.write(encode(message))
        await writer.drain()
        try:
            line = await asyncio.wait_for(reader.readline(), timeout_s)
        except ValueError:  # LimitOverrunError: over max_reply_bytes
            raise WireError(
                ErrorCode.REPLY_TOO_LARGE, f"reply over {settings.max_reply_bytes} bytes"
            ) from None
        if not line.endswith(b"\n"):
            raise ConnectionResetError("the replica closed the connection mid-reply")
        reply = decode(line)
        if not isinstance(reply.get("ok"), bool):
            raise WireError(ErrorCode.BAD_REPLY, "a reply without ok")
        return reply
    finally:
        writer.close()


class RemoteEngine:
    """The trainer's view of the rollout replicas (a `RolloutEngine`)."""

    def __init__(
        self,
        replicas: list[tuple[str, int]],
        weights_dir: Path,
        save_params: Callable[[object, Path], None] | None,
        health_interval_s: float = 5.0,
        *,
        token: Token | None = None,
        settings: ClientSettings = ClientSettings(),
    ) -> None:
        self.replicas = [Replica(h, p) for h, p in replicas]
        self.weights_dir = Path(weights_dir)
        self.save_params = save_params  # (params, folder) -> None
        if token is None and (path := token_file_from_env()) is not None:
            token = load_token(path)  # the Secret both sides mount (see auth.py)
        self._token = token
        self.settings = settings
        self._version = 0
        self._published = False  # whether a version folder exists to bring a replica up to
        self._publishing = threading.Lock()  # publishes and re-admissions, one at a time
        self._states = threading.Lock()  # replica state changes and their records
        self._backoff = Backoff(
            base_s=settings.probe_interval_s, max_s=settings.probe_max_backoff_s
        )
        self._rng = random.Random()
        self.lost: list[str] = []
        self.transitions: list[Transition] = []
        for replica in self.replicas:
            self._record(replica, ReplicaState.ALIVE)
        self.stats = EngineStats()  # generated_tokens, for the trace's tokens/s counter
        self._closed = threading.Event()
        if health_interval_s > 0:  # a replica that dies while idle is noticed, too
            threading.Thread(
                target=self._watch, args=(health_interval_s,), daemon=True, name="replica-health"
            ).start()
        threading.Thread(target=self._probe_dead, daemon=True, name="replica-probe").start()

    def _watch(self, interval_s: float) -> None:
        while not self._closed.wait(interval_s):
            self.health()

    @property
    def version(self) -> int:
        return self._version

    def warmup(self) -> None:
        """Replicas compile their own engines before they announce themselves."""
        return None

    @property
    def exhausted(self) -> bool:
        """No replica left: the orchestrator stops the run instead of failing episodes forever."""
        return not self.live

    @property
    def slots_in_use(self) -> int:
        return sum(r.in_flight for r in self.replicas)

    @property
    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def _record(self, replica: Replica, state: ReplicaState, **details) -> None:
        """Keep a state change (the caller holds `_states`, or no other thread runs yet)."""
        change = Transition(replica=replica.name, state=state, at=time.time(), **details)
        self.transitions.append(change)
        tracer = tracing.get()
        args = {k: v for k, v in details.items() if v is not None}
        tracer.instant(tracer.track("replicas"), f"{replica.name} {state.value}", args)

    def _mark_dead(self, replica: Replica, cause: str, admissions: int | None = None) -> None:
        """Out of service until a probe passes; `admissions`: the one the failure was seen in
        (a failure of the process before a re-admission says nothing about the new one)."""
        with self._states:
            if not replica.alive or admissions not in (None, replica.admissions):
                return
            replica.state, replica.cause = ReplicaState.DEAD, cause
            replica.probes, replica.probe_error = 0, ""
            replica.next_probe_at = time.monotonic() + self._backoff.delay(0, self._rng)
            self.lost.append(replica.name)
            self._record(replica, ReplicaState.DEAD, cause=cause)
        log.warning("rollout replica %s is out of service: %s", replica.name, cause)

    async def _exchange_ok(self, replica: Replica, message: dict, timeout_s: float) -> dict:
        """The replica's ok reply to `message` sent with our token, or `_Refused`."""
        if self._token is not None:
            message = {"token": self._token.reveal(), **message}
        try:
            reply = await _exchange(replica, message, timeout_s, self.settings)
            if reply["ok"]:
                return reply
            code = ErrorCode(reply.get("error"))
            text = str(reply.get("message", ""))[:200]
        except WireError as e:
            code, text = e.code, e.message
        except (OSError, TimeoutError):
            code, text = ErrorCode.ENGINE_CLOSED, "no answer (refused, reset or timed out)"
        except ValueError:  # an error code this client does not know
            code, text = ErrorCode.BAD_REPLY, "an unknown error code"
        if code == ErrorCode.AUTH:
            text = f"it refused our token (set the same token file on both sides): {text}"
        raise _Refused(code, text)

    async def _call(self, replica: Replica, message: dict, timeout_s: float) -> dict:
        """The replica's ok reply; `RemoteError` for a refused request, `EngineClosed` (and the
        replica marked dead) for a replica that cannot serve."""
        admissions = replica.admissions
        try:
            return await self._exchange_ok(replica, message, timeout_s)
        except _Refused as e:
            code, text = e.code, e.text
        if code in REQUEST_ERRORS:
            if code == ErrorCode.PROMPT_TOO_LONG:
                raise PromptTooLong(f"rollout replica {replica.name}: {text}")
            raise RemoteError(replica.name, code, text)
        self._mark_dead(replica, f"{code.value}: {text}", admissions)
        raise EngineClosed(f"rollout replica {replica.name} is gone ({code.value})")

    async def generate(self, request: GenerateRequest) -> Completion:
        live = self.live
        if not live:
            why = "; ".join(f"{r.name}: {r.cause}" for r in self.replicas) or "none configured"
            raise EngineClosed(f"no live rollout replica ({why})")
        replica = min(live, key=lambda r: r.in_flight)
        deadline = request.timeout_s or self.settings.request_timeout_s
        replica.in_flight += 1
        try:
            message = {"op": "generate", "request": request_to_json(request)}
            reply = await self._call(replica, message, deadline + self.settings.reply_grace_s)
        finally:
            replica.in_flight -= 1
        try:
            completion = completion_from_json(reply.get("completion"))
        except WireError as e:
            self._mark_dead(replica, f"{e.code.value}: {e.message}")
            raise EngineClosed(f"rollout replica {replica.name} is gone ({e.code.value})") from None
        self.stats.generated_tokens += len(completion.tokens)
        return completion

    def publish(self, params: object, version: int) -> None:
        """Write the weights once, then tell every live replica (in the background)."""
        if self.save_params is None:
            raise RuntimeError("this RemoteEngine was built without save_params")
        self.save_params(params, self.weights_dir / weights.folder_name(version))
        self._version, self._published = version, True
        threading.Thread(target=self._notify, args=(version,), daemon=True).start()

    def _notify(self, version: int) -> None:
        message = {"op": "publish", "version": version, "path": weights.folder_name(version)}
        with self._publishing:
            if version < self._version:  # a newer publish is (or was) announced: never go back
                return
            for replica in self.live:
                try:
                    asyncio.run(self._call(replica, message, self.settings.publish_timeout_s))
                except (EngineClosed, RemoteError) as e:  # RemoteError: it keeps older weights
                    log.warning("publish of version %d: %s", version, e)
            weights.prune(self.weights_dir, version, self.settings.keep_versions)

    def health(self) -> dict[str, dict]:
        """Ask every live replica; one that cannot serve, or serves another model, is marked dead
        (dead ones: not ok)."""
        out: dict[str, dict] = {}
        for replica in self.live:
            admissions = replica.admissions
            try:
                reply = asyncio.run(
                    self._call(replica, {"op": "health"}, self.settings.health_timeout_s)
                )
            except (EngineClosed, RemoteError) as e:  # RemoteError: busy, still alive
                out[replica.name] = {"ok": False, "error": str(e)}
                continue
            if why := incompatibility(reply, self.settings.model_digest):
                self._mark_dead(replica, f"{ErrorCode.INCOMPATIBLE.value}: {why}", admissions)
                reply = {"ok": False, "error": replica.cause}
            out[replica.name] = reply
        for replica in self.replicas:
            if not replica.alive:
                out[replica.name] = {"ok": False, "error": replica.cause}
        return out

    def _probe_dead(self) -> None:
        """Probe each dead replica when its backed-off time comes, until `close`."""
        idle_s = self._backoff.base_s
        while not self._closed.is_set():
            for replica in self.replicas:
                due = not replica.alive and replica.next_probe_at <= time.monotonic()
                if due and not self._closed.is_set():
                    self._probe(replica)
            now = time.monotonic()
            wake = min((r.next_probe_at for r in self.replicas if not r.alive), default=now)
            self._closed.wait(min(max(wake - now, 0.01), idle_s))

    def _probe(self, replica: Replica) -> None:
        """One bounded attempt to re-admit `replica`; a failed one waits the next backoff."""
        replica.probes += 1
        try:
            version = self._readmit(replica)
        except Exception as e:  # a bug here must cost one probe, never the prober
            if not isinstance(e, _Refused):
                log.exception("probe of rollout replica %s failed", replica.name)
                e = _Refused(ErrorCode.BAD_REPLY, "the probe failed (see the trainer's log)")
            replica.probe_error = f"{e.code.value}: {e.text}"
            wait = self._backoff.delay(replica.probes, self._rng)
            replica.next_probe_at = time.monotonic() + wait
            log.info("probe %d of %s: %s", replica.probes, replica.name, replica.probe_error)
            return
        log.warning("rollout replica %s is back in service at version %s", replica.name, version)

    def _readmit(self, replica: Replica) -> int | None:
        """Health with our token and our model, then the current weights; live again after that.
        Under `_publishing`: no publish is announced between the catch-up and the admission."""
        health = {"op": "health"}
        reply = asyncio.run(self._exchange_ok(replica, health, self.settings.health_timeout_s))
        if why := incompatibility(reply, self.settings.model_digest):
            raise _Refused(ErrorCode.INCOMPATIBLE, why)
        with self._publishing:
            version = self._version if self._published else None
            # Always sent: a new process may report the number of weights it does not hold.
            if version is not None:
                name = weights.folder_name(version)
                message = {"op": "publish", "version": version, "path": name}
                timeout_s = self.settings.publish_timeout_s
                done = asyncio.run(self._exchange_ok(replica, message, timeout_s))
                if done.get("version") != version:
                    raise _Refused(ErrorCode.BAD_REPLY, f"publish of v{version}: another version")
            with self._states:
                replica.state, replica.admissions = ReplicaState.READMITTED, replica.admissions + 1
                self._record(replica, ReplicaState.READMITTED, version=version)
        return version

    def close(self) -> None:
        self._closed.set()
