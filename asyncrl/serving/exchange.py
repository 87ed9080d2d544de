"""One request/reply between the trainer and a rollout replica, and what its failure means.

Owns the client side of an exchange: one connection per request (protocol in `wire.py`), our
token added to the message, the reply read under a deadline and a size cap, and every way it can
fail turned into a `Refused` with a wire error code. Which codes fail only the request
(`REQUEST_ERRORS`, raised to the caller as `RemoteError`) and which take the replica out of
service is stated here; acting on it (marking replicas dead, routing) is `client.py`'s.
Invariant: a `Refused` never carries the token, nor more than 200 characters of the replica's text.
"""

from __future__ import annotations

import asyncio

from asyncrl.serving.auth import Token
from asyncrl.serving.client_settings import ClientSettings
from asyncrl.serving.wire import ErrorCode, WireError, decode, encode

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


class Refused(Exception):
    """One exchange that got no ok reply: the code and a short text (never the token)."""

    def __init__(self, code: ErrorCode, text: str) -> None:
        super().__init__(f"{code.value}: {text}")
        self.code, self.text = code, text


async def exchange(
    host: str, port: int, message: dict, timeout_s: float, settings: ClientSettings
) -> dict:
    """One request/reply; `WireError` for a reply that breaks the protocol, OSError/TimeoutError
    for a replica that does not answer."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, limit=settings.max_reply_bytes),
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


async def exchange_ok(
    host: str,
    port: int,
    message: dict,
    timeout_s: float,
    *,
    token: Token | None,
    settings: ClientSettings,
) -> dict:
    """The replica's ok reply to `message` sent with `token`, or `Refused`."""
    if token is not None:
        message = {"token": token.reveal(), **message}
    try:
        reply = await exchange(host, port, message, timeout_s, settings)
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
    raise Refused(code, text)
