"""The shared secret of the trainer and its rollout replicas: loading it, and checking a peer's.

The token lives in a file (on GKE a mounted Kubernetes Secret) named by a flag or by the
ASYNCRL_ROLLOUT_TOKEN_FILE variable; both sides of the channel read the same one. No file, an
empty or short one: the replica refuses to start. Offered tokens are compared in constant time.
Invariant: the secret never appears in a repr, an exception or a log line; errors name the file.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

TOKEN_ENV = "ASYNCRL_ROLLOUT_TOKEN_FILE"
MIN_CHARS = 16
MAX_BYTES = 4096


class TokenError(ValueError):
    """No usable token is configured."""


class Token:
    """A secret that can be sent and compared, never printed."""

    __slots__ = ("_secret",)

    def __init__(self, secret: str) -> None:
        if not MIN_CHARS <= len(secret) <= MAX_BYTES or not secret.isprintable():
            raise TokenError(
                f"a rollout token must be {MIN_CHARS} to {MAX_BYTES} printable characters"
            )
        self._secret = secret.encode()

    def __repr__(self) -> str:
        return "Token(<hidden>)"

    def reveal(self) -> str:
        """The secret itself, for the one place that sends it: the client's request line."""
        return self._secret.decode()

    def matches(self, offered: object) -> bool:
        if not isinstance(offered, str):
            return False
        # surrogatepass: a JSON string may hold a lone surrogate, which plain UTF-8 refuses.
        return hmac.compare_digest(self._secret, offered.encode("utf-8", "surrogatepass"))


def load_token(path: str | os.PathLike[str] | None) -> Token:
    """The token in `path`, with surrounding whitespace (a Secret's trailing newline) removed."""
    if path is None or not os.fspath(path):
        raise TokenError(
            f"no rollout token configured: pass --token-file or set {TOKEN_ENV} to a file "
            "holding the shared secret; a replica never serves without one"
        )
    file = Path(path)
    try:
        with file.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise TokenError(f"cannot read the rollout token file {file}: {e.strerror}") from None
    try:
        text = data.decode().strip()
    except UnicodeDecodeError:
        raise TokenError(f"the rollout token file {file} is not UTF-8 text") from None
    if len(data) > MAX_BYTES or not text:
        raise TokenError(f"the rollout token file {file} is empty or over {MAX_BYTES} bytes")
    try:
        return Token(text)
    except TokenError as e:
        raise TokenError(f"the rollout token file {file}: {e}") from None


def token_file_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    return environ.get(TOKEN_ENV) or None


def write_new_token(path: Path) -> Token:
    """A fresh random token in a new file only its owner can read (for replicas started here)."""
    token = Token(secrets.token_urlsafe(32))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token.reveal())
    os.chmod(path, 0o600)  # O_CREAT's mode does not apply to a file that existed
    return token
