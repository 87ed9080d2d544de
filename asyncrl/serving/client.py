"""`RemoteEngine`: the trainer's `RolloutEngine` over rollout replicas in other processes.

Each request goes to the live replica with the fewest requests in flight, over one authenticated
connection (protocol in `wire.py`, server in `server.py`). A replica is marked dead, for good,
when it stops answering (refused, reset, silent past the request's deadline plus a grace), breaks
the protocol, refuses our token, or reports its engine closed (health included); the request then
fails with `EngineClosed`, so the episode ends as cancelled and the group queue's retry policy
re-issues it under the same group id on a live replica. With no live replica left the engine is
`exhausted` and the orchestrator ends the run with `EngineClosed`, naming why each replica died.
A request the replica refuses alone (bad request, busy, an engine error) raises `RemoteError` and
leaves the replica alive.

Weights travel as a safetensors folder per version under a directory both sides read (the run
folder; on GKE a gs:// folder mounted with Cloud Storage FUSE): the trainer writes `v<version>/`
once and tells every live replica its name; once they have all answered, versions older than the
last `keep_versions` are deleted (the writer prunes: replicas only read).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from asyncrl.config import RunConfig
from asyncrl.sampling.protocol import EngineClosed, PromptTooLong
from asyncrl.sampling.stats import EngineStats
from asyncrl.serving import weights
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

    @classmethod
    def of(cls, cfg: RunConfig) -> ClientSettings:
        """The trainer's settings for `cfg`: the largest reply its context allows, its request
        deadline, and `cluster.rollout_keep_versions` weight folders kept."""
        return cls(
            max_reply_bytes=reply_bytes_for(cfg.env.max_context),
            request_timeout_s=cfg.rollout.request_timeout_s,
            keep_versions=cfg.cluster.rollout_keep_versions,
        )


@dataclasses.dataclass
class Replica:
    host: str
    port: int
    alive: bool = True
    in_flight: int = 0
    cause: str = ""  # why it was marked dead

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"


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
        self._publishing = threading.Lock()
        self.lost: list[str] = []
        self.stats = EngineStats()  # generated_tokens, for the trace's tokens/s counter
        self._closed = threading.Event()
        if health_interval_s > 0:  # a replica that dies while idle is noticed, too
            threading.Thread(
                target=self._watch, args=(health_interval_s,), daemon=True, name="replica-health"
            ).start()

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

    def _mark_dead(self, replica: Replica, cause: str) -> None:
        if replica.alive:
            replica.alive, replica.cause = False, cause
            self.lost.append(replica.name)
            log.warning("rollout replica %s is out of service: %s", replica.name, cause)

    async def _call(self, replica: Replica, message: dict, timeout_s: float) -> dict:
        """The replica's ok reply; `RemoteError` for a refused request, `EngineClosed` (and the
        replica marked dead) for a replica that cannot serve."""
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
        if code in REQUEST_ERRORS:
            if code == ErrorCode.PROMPT_TOO_LONG:
                raise PromptTooLong(f"rollout replica {replica.name}: {text}")
            raise RemoteError(replica.name, code, text)
        if code == ErrorCode.AUTH:
            text = f"it refused our token (set the same token file on both sides): {text}"
        self._mark_dead(replica, f"{code.value}: {text}")
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
        self._version = version
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
        """Ask every live replica; one that cannot serve is marked dead (dead ones: not ok)."""
        out: dict[str, dict] = {}
        for replica in self.live:
            try:
                out[replica.name] = asyncio.run(
                    self._call(replica, {"op": "health"}, self.settings.health_timeout_s)
                )
            except (EngineClosed, RemoteError) as e:  # RemoteError: busy, still alive
                out[replica.name] = {"ok": False, "error": str(e)}
        for replica in self.replicas:
            if not replica.alive:
                out[replica.name] = {"ok": False, "error": replica.cause}
        return out

    def close(self) -> None:
        self._closed.set()
