"""`RolloutServer`: an in-process engine served on a TCP port to authenticated peers.

Each connection carries one exchange (protocol in `wire.py`). In order: the connection cap (over it
the peer gets `busy` and nothing is read), a bounded read under a deadline, the token check (a
wrong one gets `auth` and nothing else), then the op; a generate request is validated in full
before it is queued. A bad request fails alone with an error reply and the engine stays up; a
closed or dead engine is reported as `engine_closed` by every op, health included. Peers never see
exception text or server paths; the replica's log gets the details, and never the token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asyncrl.sampling.protocol import EngineClosed, PromptTooLong, RolloutEngine
from asyncrl.serving import validation, weights
from asyncrl.serving.auth import Token
from asyncrl.serving.wire import (
    ErrorCode,
    WireError,
    WireLimits,
    completion_to_json,
    decode,
    encode,
    error_reply,
)

log = logging.getLogger("asyncrl.serving")
Reply = dict[str, object]
LINGER_S = 1.0  # how long a replied connection waits for the peer to close


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    # Address to bind; loopback unless a cluster needs the replica reachable (GKE: 0.0.0.0).
    host: str = "127.0.0.1"
    # Port to bind; 0 = any free port (the bound one is printed / written to the ready file).
    port: int = 0
    # Connections served at once; beyond it a peer gets `busy`. Must exceed the trainer's
    # requests in flight per replica plus health checks and publishes.
    max_connections: int = 256
    # Seconds a peer has to send its whole request line, and to take the whole reply.
    read_timeout_s: float = 30.0
    write_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"ServerSettings.port must be in [0, 65535], got {self.port}")
        if self.max_connections < 1:
            raise ValueError(f"ServerSettings.max_connections must be >= 1: {self.max_connections}")
        for name in ("read_timeout_s", "write_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"ServerSettings.{name} must be a finite number > 0")


class RolloutServer:
    """Serves `engine` and hot-swaps its weights from version folders under `weights_root`."""

    def __init__(
        self,
        engine: RolloutEngine,
        load_params: Callable[[str], object],
        *,
        token: Token,
        limits: WireLimits,
        weights_root: Path,
        settings: ServerSettings = ServerSettings(),
        model_digest: str = "",
    ) -> None:
        if not isinstance(token, Token):
            raise TypeError("RolloutServer needs a Token: a replica never serves without one")
        self.engine, self.load_params = engine, load_params
        self.token, self.limits, self.settings = token, limits, settings
        self.weights_root = Path(weights_root)
        self.model_digest = model_digest  # reported by health: what the trainer checks on admission
        self.host, self.port = settings.host, settings.port
        self.active = 0  # connections being served
        self._publishing = asyncio.Lock()

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        server = await asyncio.start_server(
            self._handle, self.host, self.port, limit=self.limits.request_bytes
        )
        self.port = server.sockets[0].getsockname()[1]
        if ready is not None:
            ready.set()
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.active >= self.settings.max_connections:
            await self._send(reader, writer, error_reply(ErrorCode.BUSY, "at the connection cap"))
            return
        self.active += 1
        try:
            reply = await self._exchange(reader)
        except Exception:  # a bug here must cost one connection, never the server
            log.exception("rollout server: internal error")
            reply = error_reply(ErrorCode.ENGINE_ERROR, "internal error")
        finally:
            self.active -= 1
        await self._send(reader, writer, reply)

    async def _send(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: Reply | None
    ) -> None:
        """Write the reply, then read what the peer still sends until it closes (a little while,
        a few bytes): closing a socket with unread input resets it, and a reset can destroy the
        reply in flight before the peer reads it."""
        try:
            if reply is not None:
                writer.write(encode(reply))
                await asyncio.wait_for(writer.drain(), self.settings.write_timeout_s)
                if writer.can_write_eof():
                    writer.write_eof()
                await asyncio.wait_for(_discard(reader, self.limits.request_bytes), LINGER_S)
            writer.close()
        except (OSError, TimeoutError):
            writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader) -> Reply | None:
        """The reply to one peer's request (None: the peer is gone, there is nobody to answer)."""
        try:
            line = await asyncio.wait_for(reader.readline(), self.settings.read_timeout_s)
        except TimeoutError:
            return error_reply(ErrorCode.TIMEOUT, "no complete request line in time")
        except ValueError:  # asyncio's LimitOverrunError, raised by readline as ValueError
            return error_reply(ErrorCode.TOO_LARGE, f"over {self.limits.request_bytes} bytes")
        except OSError:
            return None
        if not line:
            return None
        try:
            message = decode(line)
            if not self.token.matches(message.get("token")):
                log.warning("rollout server: refused a peer with a missing or wrong token")
                return error_reply(ErrorCode.AUTH, "authentication failed")
            return await self._dispatch(message, reader)
        except WireError as e:
            return e.reply()

    async def _dispatch(self, message: dict, reader: asyncio.StreamReader) -> Reply | None:
        op = message.get("op")
        if self.engine.exhausted:
            raise WireError(ErrorCode.ENGINE_CLOSED, "the engine is closed")
        if op == "health":
            return {
                "ok": True,
                "version": self.engine.version,
                "slots_in_use": self.engine.slots_in_use,
                "model": self.model_digest,
            }
        if op == "generate":
            return await self._generate(message, reader)
        if op == "publish":
            return await self._publish(message)
        raise WireError(ErrorCode.UNKNOWN_OP, "op must be generate, publish or health")

    async def _generate(self, message: dict, reader: asyncio.StreamReader) -> Reply | None:
        request = validation.generate_request(message.get("request"), self.limits)
        generating = asyncio.ensure_future(self.engine.generate(request))
        hangup = asyncio.ensure_future(reader.read(1))  # b"": the peer went away
        try:
            await asyncio.wait({generating, hangup}, return_when=asyncio.FIRST_COMPLETED)
            if not generating.done() and (hangup.exception() or hangup.result() == b""):
                return None  # nobody waits for this completion: `finally` frees its slot
            completion = await generating
        except EngineClosed:
            raise WireError(ErrorCode.ENGINE_CLOSED, "the engine is closed") from None
        except PromptTooLong:
            raise WireError(ErrorCode.PROMPT_TOO_LONG, "no room in the context window") from None
        except (ValueError, TypeError):
            raise WireError(ErrorCode.BAD_REQUEST, "the engine refused the request") from None
        except Exception:
            log.exception("rollout server: the engine failed a request")
            code = ErrorCode.ENGINE_CLOSED if self.engine.exhausted else ErrorCode.ENGINE_ERROR
            raise WireError(code, "the engine failed the request") from None
        finally:
            hangup.cancel()
            if not generating.done():
                generating.cancel()
        return {"ok": True, "completion": completion_to_json(completion)}

    async def _publish(self, message: dict) -> Reply:
        version = validation.publish_version(message.get("version"))
        folder = weights.resolve(self.weights_root, message.get("path"), version)
        async with self._publishing:
            try:
                params = await asyncio.to_thread(self.load_params, str(folder))
                self.engine.publish(params, version)
            except Exception:
                log.exception("rollout server: loading weights version %d failed", version)
                raise WireError(
                    ErrorCode.LOAD_FAILED, f"weights version {version} could not be loaded"
                ) from None
        return {"ok": True, "version": version}


async def _discard(reader: asyncio.StreamReader, max_bytes: int) -> None:
    """Read and drop the peer's remaining input until it closes; past `max_bytes`, give up."""
    seen = 0
    while seen <= max_bytes:
        chunk = await reader.read(65536)
        if not chunk:
            return
        seen += len(chunk)
    raise TimeoutError  # a peer still sending after its reply: cut it off
