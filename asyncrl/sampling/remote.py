"""Remote rollout (`cluster.placement: remote`): engines in their own processes, served over TCP.

Wire protocol: one JSON object per line over a TCP connection, one request per connection.
    {"op": "generate", "request": {...}}    -> {"ok": true, "completion": {...}}
    {"op": "publish", "version": v, "path": DIR} -> {"ok": true, "version": v}
    {"op": "health"}                          -> {"ok": true, "version": v, "slots_in_use": n}
Weights travel as a Hugging Face safetensors folder per version under a directory both sides
read (the run folder; on GKE a gs:// folder mounted with Cloud Storage FUSE): the trainer writes
`weights/v<version>/` once, and every replica loads it and swaps it in between decode steps.

`RolloutServer` wraps an in-process `Engine`. `RemoteEngine` is the trainer's `RolloutEngine`:
each request goes to the live replica with the fewest requests in flight; a replica that stops
answering (connection refused or reset, or a failed health check) is marked dead, and the request
fails with `EngineClosed`, so the episode ends as cancelled and the group queue's retry policy
re-issues it under the same group id on a live replica. With no live replica left the engine is
`exhausted` and the orchestrator ends the run with `EngineClosed` (a clear error, no busy loop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path

from asyncrl.sampling.protocol import EngineClosed
from asyncrl.sampling.stats import EngineStats
from asyncrl.types import Completion, FinishReason, GenerateRequest, SamplingParams


def request_to_json(r: GenerateRequest) -> dict:
    return {
        "prompt": list(r.prompt),
        "params": dataclasses.asdict(r.params),
        "session": r.session,
        "timeout_s": r.timeout_s,
    }


def request_from_json(d: dict) -> GenerateRequest:
    p = dict(d["params"])
    p["stop_tokens"] = tuple(p["stop_tokens"])
    p["stop_strings"] = tuple(p["stop_strings"])
    return GenerateRequest(
        prompt=tuple(d["prompt"]),
        params=SamplingParams(**p),
        session=d["session"],
        timeout_s=d["timeout_s"],
    )


def completion_to_json(c: Completion) -> dict:
    return {
        "tokens": [int(t) for t in c.tokens],
        "logprobs": [float(x) for x in c.logprobs],
        "raw_logprobs": [float(x) for x in c.raw_logprobs],
        "versions": [int(v) for v in c.versions],
        "finish_reason": c.finish_reason.value,
        "prompt_tokens": int(c.prompt_tokens),
        "cached_tokens": int(c.cached_tokens),
    }


def completion_from_json(d: dict) -> Completion:
    return Completion(
        tokens=tuple(d["tokens"]),
        logprobs=tuple(d["logprobs"]),
        raw_logprobs=tuple(d["raw_logprobs"]),
        versions=tuple(d["versions"]),
        finish_reason=FinishReason(d["finish_reason"]),
        prompt_tokens=d["prompt_tokens"],
        cached_tokens=d["cached_tokens"],
    )


async def _exchange(host: str, port: int, message: dict, timeout_s: float | None) -> dict:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10.0)
    try:
        writer.write(json.dumps(message).encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        if not line:
            raise ConnectionResetError("the replica closed the connection")
        return json.loads(line)
    finally:
        writer.close()


class RolloutServer:
    """Serves an in-process engine (and hot-swaps its weights) on a TCP port."""

    def __init__(self, engine, load_params, host: str = "127.0.0.1", port: int = 0) -> None:
        self.engine, self.load_params = engine, load_params
        self.host, self.port = host, port

    async def _handle(self, reader, writer) -> None:
        try:
            message = json.loads(await reader.readline())
            op = message.get("op")
            if op == "generate":
                completion = await self.engine.generate(request_from_json(message["request"]))
                reply = {"ok": True, "completion": completion_to_json(completion)}
            elif op == "publish":
                params = await asyncio.to_thread(self.load_params, message["path"])
                self.engine.publish(params, int(message["version"]))
                reply = {"ok": True, "version": int(message["version"])}
            elif op == "health":
                reply = {
                    "ok": True,
                    "version": self.engine.version,
                    "slots_in_use": self.engine.slots_in_use,
                }
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
            data = json.dumps(reply)
        except Exception as e:  # one bad request never takes the server down
            data = json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"})
        writer.write(data.encode() + b"\n")
        await writer.drain()
        writer.close()

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        if ready is not None:
            ready.set()
        async with server:
            await server.serve_forever()


@dataclasses.dataclass
class Replica:
    host: str
    port: int
    alive: bool = True
    in_flight: int = 0

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"


class RemoteEngine:
    """The trainer's view of the rollout replicas (a `RolloutEngine`)."""

    def __init__(
        self,
        replicas: list[tuple[str, int]],
        weights_dir: Path,
        save_params,
        health_interval_s: float = 5.0,
    ) -> None:
        self.replicas = [Replica(h, p) for h, p in replicas]
        self.weights_dir = Path(weights_dir)
        self.save_params = save_params  # (params, folder) -> None
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

    def _mark_dead(self, replica: Replica) -> None:
        if replica.alive:
            replica.alive = False
            self.lost.append(replica.name)

    async def generate(self, request: GenerateRequest) -> Completion:
        live = self.live
        if not live:
            raise EngineClosed("no live rollout replica")
        replica = min(live, key=lambda r: r.in_flight)
        replica.in_flight += 1
        try:
            reply = await _exchange(
                replica.host,
                replica.port,
                {"op": "generate", "request": request_to_json(request)},
                request.timeout_s,
            )
        except (OSError, ConnectionError, asyncio.IncompleteReadError, json.JSONDecodeError):
            self._mark_dead(replica)
            raise EngineClosed(f"rollout replica {replica.name} is gone") from None
        finally:
            replica.in_flight -= 1
        if not reply.get("ok"):
            raise RuntimeError(f"rollout replica {replica.name}: {reply.get('error')}")
        completion = completion_from_json(reply["completion"])
        self.stats.generated_tokens += len(completion.tokens)
        return completion

    def publish(self, params, version: int) -> None:
        """Write the weights once, then tell every live replica (in the background)."""
        folder = self.weights_dir / f"v{version}"
        self.save_params(params, folder)
        self._version = version
        threading.Thread(target=self._notify, args=(version, folder), daemon=True).start()

    def _notify(self, version: int, folder: Path) -> None:
        with self._publishing:
            for replica in self.live:
                message = {"op": "publish", "version": version, "path": str(folder)}
                try:
                    asyncio.run(_exchange(replica.host, replica.port, message, 120.0))
                except (OSError, ConnectionError, json.JSONDecodeError):
                    self._mark_dead(replica)

    def health(self) -> dict[str, dict]:
        """Ask every live replica; one that does not answer is marked dead (dead ones: not ok)."""
        out: dict[str, dict] = {r.name: {"ok": False} for r in self.replicas if not r.alive}
        for replica in self.live:
            try:
                out[replica.name] = asyncio.run(
                    _exchange(replica.host, replica.port, {"op": "health"}, 10.0)
                )
            except (OSError, ConnectionError, json.JSONDecodeError):
                self._mark_dead(replica)
                out[replica.name] = {"ok": False}
        return out

    def close(self) -> None:
        self._closed.set()
