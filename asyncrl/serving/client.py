"""`RemoteEngine`: the trainer's `RolloutEngine` over rollout replicas in other processes.

Each request goes to the live replica with the fewest requests in flight, over one authenticated
connection (one exchange: `exchange.py`; protocol in `wire.py`, server in `server.py`). A replica
is marked dead when it stops answering (refused, reset, silent past the request's deadline plus a
grace), breaks the protocol, refuses our token, serves another model (health's digest,
`admission.py`), or reports its engine closed (health included); the request then fails with
`EngineClosed`, so the episode ends as cancelled and the group queue's retry policy re-issues it
under the same group id on a live replica. With no live replica left the engine is `exhausted` and
the orchestrator ends the run with `EngineClosed`, naming why each replica died. A request the
replica refuses alone (bad request, busy, an engine error) raises `RemoteError` and leaves the
replica alive.

A dead replica is probed again in the background (a restarted pod keeps its DNS name; the name is
resolved anew on every connection), with backed-off, jittered waits (`admission.Backoff`), each
probe bounded by the connect and health timeouts. It is re-admitted once it answers a health call
with our token (the path every request takes) and our model digest, and has loaded the current
weight version; only then is it live again. Every state change is a typed `Transition` in
`transitions` and an instant on the trace's "replicas" track (the bookkeeping: `replica_set.py`).

Weights travel as a safetensors folder per version under a directory both sides read (the run
folder; on GKE a gs:// folder mounted with Cloud Storage FUSE): the trainer writes `v<version>/`
once and tells every live replica its name, all at once; once they have all answered, versions
older than the last `keep_versions` are deleted (the writer prunes: replicas only read).
Publishes and re-admissions run one at a time, so no replica is ever sent an older version after
a newer one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.sampling.protocol import EngineClosed, PromptTooLong
from asyncrl.sampling.stats import EngineStats
from asyncrl.serving import weights
from asyncrl.serving.admission import Backoff, Transition, incompatibility
from asyncrl.serving.auth import Token, load_token, token_file_from_env
from asyncrl.serving.client_settings import ClientSettings
from asyncrl.serving.exchange import REQUEST_ERRORS, Refused, RemoteError, exchange_ok
from asyncrl.serving.replica_set import Replica, ReplicaSet
from asyncrl.serving.wire import ErrorCode, WireError, completion_from_json, request_to_json
from asyncrl.types import Completion, GenerateRequest

log = logging.getLogger("asyncrl.serving")
DEFAULT_SETTINGS = ClientSettings()  # frozen: one shared instance is safe


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
        settings: ClientSettings = DEFAULT_SETTINGS,
    ) -> None:
        self.weights_dir = Path(weights_dir)
        self.save_params = save_params  # (params, folder) -> None
        if token is None and (path := token_file_from_env()) is not None:
            token = load_token(path)  # the Secret both sides mount (see auth.py)
        self._token = token
        self.settings = settings
        self._version = 0
        self._published = False  # whether a version folder exists to bring a replica up to
        self._publishing = threading.Lock()  # publishes and re-admissions, one at a time
        backoff = Backoff(base_s=settings.probe_interval_s, max_s=settings.probe_max_backoff_s)
        self._set = ReplicaSet(replicas, backoff)
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
    def replicas(self) -> list[Replica]:
        return self._set.replicas

    @property
    def live(self) -> list[Replica]:
        return self._set.live

    @property
    def lost(self) -> list[str]:
        """Names of the replicas marked dead, in order (one that died twice is named twice)."""
        return self._set.lost

    @property
    def transitions(self) -> list[Transition]:
        return self._set.transitions

    @property
    def slots_in_use(self) -> int:
        return self._set.slots_in_use

    async def _exchange_ok(self, replica: Replica, message: dict, timeout_s: float) -> dict:
        """The replica's ok reply to `message` sent with our token, or `Refused`."""
        token, settings = self._token, self.settings
        return await exchange_ok(
            replica.host, replica.port, message, timeout_s, token=token, settings=settings
        )

    async def _call(self, replica: Replica, message: dict, timeout_s: float) -> dict:
        """The replica's ok reply; `RemoteError` for a refused request, `EngineClosed` (and the
        replica marked dead) for a replica that cannot serve."""
        admissions = replica.admissions
        try:
            return await self._exchange_ok(replica, message, timeout_s)
        except Refused as e:
            code, text = e.code, e.text
        if code in REQUEST_ERRORS:
            if code == ErrorCode.PROMPT_TOO_LONG:
                raise PromptTooLong(f"rollout replica {replica.name}: {text}")
            raise RemoteError(replica.name, code, text)
        self._set.mark_dead(replica, f"{code.value}: {text}", admissions)
        raise EngineClosed(f"rollout replica {replica.name} is gone ({code.value})")

    async def generate(self, request: GenerateRequest) -> Completion:
        live = self.live
        if not live:
            raise EngineClosed(f"no live rollout replica ({self._set.causes()})")
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
            self._set.mark_dead(replica, f"{e.code.value}: {e.message}")
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
        """Announce `version` to every live replica at once, then prune the old folders. Under
        `_publishing`: a publish waits for the previous one, so none goes back to older weights."""
        message = {"op": "publish", "version": version, "path": weights.folder_name(version)}
        with self._publishing:
            if version < self._version:  # a newer publish is (or was) announced: never go back
                return
            asyncio.run(self._announce(message))
            weights.prune(self.weights_dir, version, self.settings.keep_versions)

    async def _announce(self, message: dict) -> None:
        """Send `message` to the live replicas concurrently, each call bounded by the publish
        timeout: a publish takes the slowest replica's load time, not the sum of them all."""
        timeout_s = self.settings.publish_timeout_s
        calls = [self._call(replica, message, timeout_s) for replica in self.live]
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(outcome, (EngineClosed, RemoteError)):  # RemoteError: keeps older ones
                log.warning("publish of version %d: %s", message["version"], outcome)
            elif isinstance(outcome, BaseException):
                raise outcome

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
                self._set.mark_dead(replica, f"{ErrorCode.INCOMPATIBLE.value}: {why}", admissions)
                reply = {"ok": False, "error": replica.cause}
            out[replica.name] = reply
        for replica in self.replicas:
            if not replica.alive:
                out[replica.name] = {"ok": False, "error": replica.cause}
        return out

    def _probe_dead(self) -> None:
        """Probe each dead replica when its backed-off time comes, until `close`."""
        while not self._closed.is_set():
            for replica in self.replicas:
                due = not replica.alive and replica.next_probe_at <= time.monotonic()
                if due and not self._closed.is_set():
                    self._probe(replica)
            self._closed.wait(self._set.seconds_to_next_probe(self.settings.probe_interval_s))

    def _probe(self, replica: Replica) -> None:
        """One bounded attempt to re-admit `replica`; a failed one waits the next backoff."""
        replica.probes += 1
        try:
            version = self._readmit(replica)
        except Exception as e:  # a bug here must cost one probe, never the prober
            if not isinstance(e, Refused):
                log.exception("probe of rollout replica %s failed", replica.name)
                e = Refused(ErrorCode.BAD_REPLY, "the probe failed (see the trainer's log)")
            self._set.probe_failed(replica, f"{e.code.value}: {e.text}")
            return
        log.warning("rollout replica %s is back in service at version %s", replica.name, version)

    def _readmit(self, replica: Replica) -> int | None:
        """Health with our token and our model, then the current weights; live again after that.
        Under `_publishing`: no publish is announced between the catch-up and the admission."""
        health = {"op": "health"}
        reply = asyncio.run(self._exchange_ok(replica, health, self.settings.health_timeout_s))
        if why := incompatibility(reply, self.settings.model_digest):
            raise Refused(ErrorCode.INCOMPATIBLE, why)
        with self._publishing:
            version = self._version if self._published else None
            # Always sent: a new process may report the number of weights it does not hold.
            if version is not None:
                name = weights.folder_name(version)
                message = {"op": "publish", "version": version, "path": name}
                timeout_s = self.settings.publish_timeout_s
                done = asyncio.run(self._exchange_ok(replica, message, timeout_s))
                if done.get("version") != version:
                    raise Refused(ErrorCode.BAD_REPLY, f"publish of v{version}: another version")
            self._set.readmit(replica, version)
        return version

    def close(self) -> None:
        self._closed.set()
