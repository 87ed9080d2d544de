"""What a tool may know about the episode calling it: an idempotency key and whether it is a replay.

After a restore, episodes that were in flight at the checkpoint run again under the same episode
id. A tool with side effects (writing a file, calling a service) reads `current_episode()` and uses
`idempotency_key` to make the repeated call harmless; `replay` says the episode ran before. The
episode sets the context in its own asyncio task, so concurrent episodes never see each other's.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EpisodeContext:
    idempotency_key: str  # the episode id: the same when the episode is re-issued
    replay: bool = False


_CURRENT: contextvars.ContextVar[EpisodeContext | None] = contextvars.ContextVar(
    "asyncrl_episode", default=None
)


def current_episode() -> EpisodeContext | None:
    return _CURRENT.get()


def enter_episode(context: EpisodeContext) -> None:
    """Set the context for the calling asyncio task (and the tasks it creates)."""
    _CURRENT.set(context)
